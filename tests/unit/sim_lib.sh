# Shared by the CPU-simulation test scripts (tests/unit/test_*_sim.sh), sourced after they set $dir:
# sim_build NAME SOURCE [FLAGS...] builds $dir/NAME from SOURCE (with the cut .inc files in $dir) as
# C++20 with std::barrier; a compiler without <barrier> makes the script SKIP (exit 77), any other
# build error FAIL (exit 1) with the compiler's output.
# sim_cut_k45 OUT writes the int8 unit's device source to OUT: kernels/cuda/k45_i8.cuh's device part
# without its #include and its mma.sync (tests/unit/sim_warp.h has its own), after gemv_mma.cuh's
# gm_k45_w / gm_k45_load (they fill a lane's weight words); FAIL (exit 1) when the markers moved.
# sim_san_align prints the flags of UBSan's alignment check where the compiler has it (else nothing): a
# misaligned word load, which x86 performs and the GPU's shared memory does not, then stops the run.
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

sim_cut_k45() {
	local out=$1 src=kernels/cuda/k45_i8.cuh mma=kernels/cuda/gemv_mma.cuh s1 e1 s2 e2 s3 e3
	s1=$(grep -n '^#define MI8_P ' $src | cut -d: -f1)
	e1=$(grep -n '^/\* D += A \* B, m16n8k32' $src | cut -d: -f1)
	s2=$(grep -n '^/\* the low bytes of a, b, c, d' $src | cut -d: -f1)
	e2=$(grep -n '^#endif' $src | tail -1 | cut -d: -f1)
	s3=$(grep -n '^template <int T, int R> struct gm_k45_w {' $mma | cut -d: -f1)
	e3=$(grep -n '^template <int T, int R, int NG, class LN> GM_HD void gm_k45_math' $mma | cut -d: -f1)
	if [ -z "$s1" ] || [ -z "$e1" ] || [ -z "$s2" ] || [ -z "$e2" ] || [ -z "$s3" ] || [ -z "$e3" ]; then
		echo "FAIL: the markers moved ($src: #define MI8_P ... /* D += A * B, m16n8k32, /* the low bytes ... #endif;"
		echo "      $mma: struct gm_k45_w ... gm_k45_math)"
		exit 1
	fi
	{
		sed -n "${s3},$((e3 - 1))p" $mma
		sed -n "${s1},$((e1 - 1))p" $src
		sed -n "${s2},$((e2 - 1))p" $src
	} >"$out"
}

sim_san_align() {
	local san="-fsanitize=alignment -fno-sanitize-recover=alignment"
	echo 'int main() { return 0; }' | ${CXX:-g++} $san -x c++ -o "$dir/san_probe" - 2>/dev/null && echo "$san"
}
