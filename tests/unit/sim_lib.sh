# Shared by the CPU-simulation test scripts (tests/unit/test_*_sim.sh), sourced after they set $dir:
# sim_build NAME SOURCE [FLAGS...] builds $dir/NAME from SOURCE (with the cut .inc files in $dir) as
# C++20 with std::barrier; a compiler without <barrier> makes the script SKIP (exit 77), any other
# build error FAIL (exit 1) with the compiler's output.
sim_build() {
	local name=$1 src=$2
	shift 2
	if ! ${CXX:-g++} -std=c++20 -O1 -pthread "$@" -I. -I"$dir" -o "$dir/$name" "$src" 2>"$dir/build.log"; then
		if grep -q 'barrier' "$dir/build.log" &&
			! echo '#include <barrier>' | ${CXX:-g++} -std=c++20 -x c++ -fsyntax-only - 2>/dev/null; then
			echo "SKIP: no C++20 <barrier> in ${CXX:-g++}"
			exit 77
		fi
		cat "$dir/build.log"
		echo "FAIL: $src does not build"
		exit 1
	fi
}
