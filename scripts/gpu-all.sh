#!/usr/bin/env bash
# One GPU session's checks and timings, most important first, from binaries staged by
# scripts/gpu-stage-all.sh (builds nothing). Every step has its own timeout and the whole run a
# budget (BUDGET seconds, default 300): a step that would start past it is skipped and listed.
# OPS_FULL=1 runs the op tests whole (raise BUDGET: the full set takes several minutes).
# Logs go to $OUT/logs.tar.gz, the table of steps to $OUT/summary.txt (and stdout, last).
#   bash .carry-all/gpu-all.sh .carry-all        (run from the repository root)
set -u
C=${1:-.carry-all}
O=${OUT:-/tmp/gpu-out}
BUDGET=${BUDGET:-300}
L=/tmp/gpu-logs
rm -rf "$L" && mkdir -p "$L" "$O"
mkdir -p "$C/b" && tar -C "$C/b" -xJf "$C/bins.tar.xz"
B=$C/b
export LD_LIBRARY_PATH="$PWD/$C/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if ldd "$B/tandem" | grep -q 'libcublas.*not found'; then
	d=$(dirname "$(find / -name 'libcublas.so.13*' -not -path '/proc/*' 2>/dev/null | head -1)")
	export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d
fi
export NCCL_NVLS_ENABLE=0
# TP over GPUs dlopens libnccl.so.2: point at it when the loader's cache does not know it
if ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2'; then
	n=$(find / -name 'libnccl.so.2*' -not -path '/proc/*' 2>/dev/null | head -1)
	[ -n "$n" ] && export TANDEM_NCCL_LIB=$n
fi
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c GPU)
T0=$SECONDS
SUMMARY=()

# step NAME LIMIT CMD...: runs CMD with its output in $L/NAME.log, records rc, time and last line
step() {
	local name=$1 limit=$2
	shift 2
	local left=$((BUDGET - (SECONDS - T0)))
	if [ "$left" -lt 8 ]; then
		SUMMARY+=("$(printf '%-34s SKIPPED (run budget spent)' "$name")")
		return
	fi
	[ "$limit" -gt "$left" ] && limit=$left
	local t=$SECONDS
	echo "== $name (limit ${limit}s)"
	timeout -k 3 "$limit" "$@" >"$L/$name.log" 2>&1
	local rc=$?
	SUMMARY+=("$(printf '%-34s rc=%-3d %4ds  %s' "$name" "$rc" $((SECONDS - t)) "$(tail -n 1 "$L/$name.log" | cut -c1-110)")")
	# what is done so far goes to $OUT after every step, so a run cut short still returns it
	printf '%s\n' "${SUMMARY[@]}" >"$O/summary.txt"
	tar -C "$L" -czf "$O/logs.tar.gz" .
}
# gpu2 NAME LIMIT CMD...: a step that needs two GPUs
gpu2() {
	if [ "$NGPU" -ge 2 ]; then step "$@"; else SUMMARY+=("$(printf '%-34s SKIPPED (%d GPU)' "$1" "$NGPU")"); fi
}

{
	date -u
	nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv
	nvidia-smi topo -m 2>/dev/null
} >"$L/machine.log" 2>&1
cat "$L/machine.log"

# ---- correctness first; a new path that fails its op test is switched off for the timings ----
ok() { grep -q "^$1 *rc=0 " <<<"$(printf '%s\n' "${SUMMARY[@]}")"; }
step test_gpu_model 120 "$B/tests/test_gpu_model"
# the paths an sm_120 GPU (RTX PRO 6000: 99 KB of shared memory a block) takes, on this one
step test_gpu_model_smem99k 60 env TANDEM_CUDA_SMEM_CAP=101376 "$B/tests/test_gpu_model"
[ -x "$B/tests/test_gpu_upload" ] && step test_gpu_upload 60 "$B/tests/test_gpu_upload"
# OPS_FULL=1: every case of the op tests (minutes each), not the QUICK subset; the QUICK runs skip
# cases (test_ops_fused's bias-less idx_prep crashed unseen from session 10 to 14 that way)
OPSQ=TANDEM_OPS_QUICK=1 OPSLIM=60
[ "${OPS_FULL:-0}" = 1 ] && OPSQ=TANDEM_OPS_FULL=1 OPSLIM=420
for t in matmul head_gemv moe prefill_moe fused mla mla_dense indexer allreduce rowops sample multi gemv_res upload; do
	[ -x "$B/tests/test_ops_$t" ] && step "test_ops_$t" $OPSLIM env $OPSQ "$B/tests/test_ops_$t"
done
ALLREF="TANDEM_CUDA_ATTN=ref TANDEM_MOE_SORTED=0 TANDEM_MOE_FAST=0 TANDEM_HEAD_GEMV=0 TANDEM_GEMV_MMA=0 TANDEM_PREFILL_FAST=0 TANDEM_FUSE=0 TANDEM_GEMV3=0 TANDEM_MULTI=0"
if ! ok test_gpu_model; then # which new path: everything old, then one old path at a time
	step test_gpu_model_allref 40 env $ALLREF "$B/tests/test_gpu_model"
	for v in TANDEM_CUDA_ATTN=ref TANDEM_MLA_DENSE=0 TANDEM_MOE_FAST=0 TANDEM_GEMV_MMA=0 TANDEM_FUSE=0 TANDEM_GEMV3=0 TANDEM_MULTI=0; do
		step "test_gpu_model_${v%%=*}" 30 env "$v" "$B/tests/test_gpu_model"
	done
fi
{ ok test_ops_mla && ok test_ops_indexer; } || export TANDEM_CUDA_ATTN=ref
ok test_ops_head_gemv || export TANDEM_HEAD_GEMV=0
{ ok test_ops_matmul && ok test_ops_head_gemv; } || export TANDEM_GEMV_MMA=0 TANDEM_GEMV3=0
ok test_ops_moe || export TANDEM_MOE_SORTED=0 TANDEM_MOE_FAST=0 TANDEM_MOE_SMALL=0
ok test_ops_prefill_moe || export TANDEM_PREFILL_FAST=0
ok test_ops_fused || export TANDEM_FUSE=0
ok test_ops_multi || export TANDEM_MULTI=0
ok test_ops_mla_dense || export TANDEM_MLA_DENSE=0
sw="switches for the timings: ATTN=${TANDEM_CUDA_ATTN:-new} GEMV_MMA=${TANDEM_GEMV_MMA:-1} HEAD_GEMV=${TANDEM_HEAD_GEMV:-1}"
sw="$sw MOE_FAST=${TANDEM_MOE_FAST:-1} MOE_SORTED=${TANDEM_MOE_SORTED:-1} PREFILL_FAST=${TANDEM_PREFILL_FAST:-1} FUSE=${TANDEM_FUSE:-1}"
sw="$sw GEMV3=${TANDEM_GEMV3:-1}"
sw="$sw MULTI=${TANDEM_MULTI:-1} MLA_DENSE=${TANDEM_MLA_DENSE:-1}"
echo "$sw" | tee "$L/switches.log"
SUMMARY+=("$sw")
# the prefill MoE kernels end to end: 64-token batches of the test models through them (bf16 path)
step test_gpu_model_folds 30 env TANDEM_IDX_FOLD=1 TANDEM_MLA_ROPE=1 "$B/tests/test_gpu_model"
ok test_ops_prefill_moe && step test_gpu_model_moe_mma 30 env TANDEM_MOE_MMA_MIN=17 "$B/tests/test_gpu_model"
gpu2 test_gpu_tp 60 "$B/tests/test_gpu_tp"
step test_gpu_workers_sh 40 env BUILD="$B" TANDEM_GPU_TESTS=1 bash tests/e2e/test_gpu_workers.sh

# ---- timings ----
SYN="--synthetic glm5 --tp 8 --rank 0 --backend cuda"
step glm5_matrix 60 "$B/tandem" bench $SYN --matrix --matrix-ctx 4096 --gen 6 --profile
# the low-bit files' layout (routed experts in codebook types: moe_mma's tensor-core units since session 32,
# no int8 unit), and gate / up of different types (kcuda_moe_ffn's split path)
step glm5_iq2_mix 40 "$B/tandem" bench $SYN --type q4_k,exps=iq2_xxs,down_exps=iq3_xxs --matrix --matrix-ctx 4096 --matrix-batch 1,8,32 --gen 6 --matrix-prefill 2048
# the same with the prefill MoE kernels (bf16 tensor-core tiles, every type) at every batch, and with
# TANDEM_MOE_FAST=0 (the generic per-row kernels these types had before session 32)
step glm5_iq2_mix_mma1 40 env TANDEM_MOE_MMA_MIN=1 "$B/tandem" bench $SYN --type q4_k,exps=iq2_xxs,down_exps=iq3_xxs --matrix --matrix-ctx 4096 --matrix-batch 1,8,32 --gen 6 --matrix-prefill 0
step glm5_iq2_mix_generic 40 env TANDEM_MOE_FAST=0 "$B/tandem" bench $SYN --type q4_k,exps=iq2_xxs,down_exps=iq3_xxs --matrix --matrix-ctx 4096 --matrix-batch 1,8,32 --gen 6 --matrix-prefill 0
step glm5_split_mix 40 "$B/tandem" bench $SYN --type q4_k,exps=iq2_xxs,up_exps=iq3_s,down_exps=iq3_xxs --matrix --matrix-ctx 4096 --matrix-batch 1,8 --gen 6 --matrix-prefill 2048
step glm5_matrix_nopdl 40 env TANDEM_PDL=0 "$B/tandem" bench $SYN --matrix --matrix-ctx 4096 --matrix-batch 1,8 --gen 6 --matrix-prefill 0
# front4: products of one x in one launch (TANDEM_MULTI), single wide Q8_0 through it (TANDEM_MULTI_WIDE),
# x before the wait (TANDEM_MULTI_HOIST=1), q_b fused with idx_q_b before the query branch (TANDEM_MULTI_QB=1)
step glm5_matrix_nomulti 40 env TANDEM_MULTI=0 "$B/tandem" bench $SYN --matrix --matrix-ctx 4096 --matrix-batch 1,8 --gen 6 --matrix-prefill 0
step glm5_matrix_multiwide 40 env TANDEM_MULTI_WIDE=1 "$B/tandem" bench $SYN --matrix --matrix-ctx 4096 --matrix-batch 1,8 --gen 6 --matrix-prefill 0
step glm5_matrix_multihoist 40 env TANDEM_MULTI_HOIST=1 "$B/tandem" bench $SYN --matrix --matrix-ctx 4096 --matrix-batch 1,8 --gen 6 --matrix-prefill 0
step glm5_matrix_multi_qb 40 env TANDEM_MULTI_QB=1 "$B/tandem" bench $SYN --matrix --matrix-ctx 4096 --matrix-batch 1,8 --gen 6 --matrix-prefill 0
# the int8 MoE unit off (TANDEM_MOE_I8=0), and the int8 parts of the activations off (session 10), for
# the A/B against the default
step glm5_matrix_xparts_off 40 env TANDEM_NORM_XPARTS=0 TANDEM_LATENT_XPARTS=0 "$B/tandem" bench $SYN --matrix --matrix-ctx 4096 --matrix-batch 1 --gen 8 --matrix-prefill 0
# 4 Q8_0 rows a block everywhere (the one-wave rule off: GLM-5's o back to 1536 blocks; session 11)
step glm5_matrix_rb4 40 env TANDEM_MULTI_RB=4 "$B/tandem" bench $SYN --matrix --matrix-ctx 4096 --matrix-batch 1 --gen 8 --matrix-prefill 0
step glm5_matrix_moe_fp16 40 env TANDEM_MOE_I8=0 "$B/tandem" bench $SYN --matrix --matrix-ctx 4096 --matrix-batch 1,8 --gen 6 --matrix-prefill 0
[ -x "$B/bench/bench_cuda_multi" ] && step bench_cuda_multi 20 "$B/bench/bench_cuda_multi"
# session 15: the int8 5-8 token product (off: slower in the step), all its products and idx_q_b alone
# (the latent's parts, 35 KB blocks); the MLA split count at the old 2 blocks an SM against the occupancy's
step glm5_matrix_xm 40 env TANDEM_MULTI_XM=1 "$B/tandem" bench $SYN --matrix --matrix-ctx 4096 --matrix-batch 5,8 --gen 6 --matrix-prefill 0
step glm5_matrix_xm_idxqb 40 env TANDEM_MULTI_XM=1 TANDEM_MULTI_XM_QUANT=0 TANDEM_XPARTS_ROWS=8 "$B/tandem" bench $SYN --matrix --matrix-ctx 4096 --matrix-batch 5,8 --gen 6 --matrix-prefill 0
# the MLA key tile copied by one asm of three cp.async a lane (session 32, built without a GPU): its op test,
# the attention bench and the large-batch steps against the default
step test_ops_mla_cp3 60 env TANDEM_MLA_CP3=1 $OPSQ "$B/tests/test_ops_mla"
ok test_ops_mla_cp3 && step bench_cuda_attn_cp3 30 env TANDEM_MLA_CP3=1 "$B/bench/bench_cuda_attn"
ok test_ops_mla_cp3 && step glm5_matrix_cp3 40 env TANDEM_MLA_CP3=1 "$B/tandem" bench $SYN --matrix --matrix-ctx 4096 --matrix-batch 32,128 --gen 6 --matrix-prefill 8192
step glm5_matrix_split2 40 env TANDEM_MLA_SPLIT_BPS=2 "$B/tandem" bench $SYN --matrix --matrix-ctx 4096 --matrix-batch 8,32 --gen 6 --matrix-prefill 0
step glm5_b1_nopdl 25 env TANDEM_PDL=0 "$B/tandem" bench $SYN --kv-fill random --ctx 4096 --gen 12 --batch 1 --reps 1
step anchor_glm5_4l_tp1 30 "$B/tandem" bench --synthetic glm5 --layers 4 --dense 1 --type q4_k --backend cuda \
	--prompt 512 --gen 64 --batch 1 --reps 3 --threads 8
[ -x "$B/bench/bench_cuda_moe" ] && step bench_cuda_moe 25 "$B/bench/bench_cuda_moe"
step ds3_matrix 30 "$B/tandem" bench --synthetic deepseek3 --tp 8 --rank 0 --backend cuda --matrix \
	--matrix-ctx 4096 --gen 4 --matrix-prefill 2048
step bench_cuda_gemv_glm 20 "$B/bench/bench_cuda_gemv_mma" glm
step bench_cuda_attn 30 "$B/bench/bench_cuda_attn"
step bench_cuda_pdl 20 "$B/bench/bench_cuda_pdl"
gpu2 bench_cuda_allreduce 40 "$B/bench/bench_cuda_allreduce"
gpu2 bench_cuda_allreduce_oneshot 40 env TANDEM_TP_ONESHOT=1 "$B/bench/bench_cuda_allreduce"
gpu2 test_gpu_tp_oneshot 60 env TANDEM_TP_ONESHOT=1 "$B/tests/test_gpu_tp"
gpu2 synth_glm5_tp2 60 "$B/tandem" bench --synthetic glm5 --layers 4 --dense 1 --tp 2 --backend cuda \
	--ctx 4096 --gen 32 --reps 2
step glm5_b1_allref 25 env $ALLREF "$B/tandem" bench $SYN --kv-fill random --ctx 4096 --gen 12 --batch 1 --reps 1
step glm5_matrix_32k 40 "$B/tandem" bench $SYN --matrix --matrix-ctx 32768 --gen 4 --matrix-prefill 0
# weight upload from a real file (17.3 GiB, the anchor's shape): page cache warm, then cold if allowed
if [ "${LOAD_REAL:-0}" = 1 ]; then
	step mkmodel_glm5_4l 120 "$B/tandem" mkmodel --preset glm5 --layers 4 --dense 1 --type q4_k -o /tmp/g4.gguf
	step load_real_warm 60 "$B/tandem" bench -m /tmp/g4.gguf --backend cuda --prompt 512 --gen 32 --reps 1
	step load_real_cold 90 bash -c "sync; echo 3 >/proc/sys/vm/drop_caches && $B/tandem bench -m /tmp/g4.gguf \
		--backend cuda --prompt 512 --gen 32 --reps 1"
	rm -f /tmp/g4.gguf
fi
step test_gpu_workers 30 "$B/tests/test_gpu_workers"
if command -v compute-sanitizer >/dev/null; then
	for t in fused moe prefill_moe matmul head_gemv mla mla_dense indexer multi; do
		step "memcheck_$t" 40 env TANDEM_OPS_QUICK=1 TANDEM_OPS_SMALL=1 \
			compute-sanitizer --tool memcheck --error-exitcode 9 "$B/tests/test_ops_$t"
	done
fi

{
	echo "==== gpu-all.sh: $NGPU GPU(s), $((SECONDS - T0)) s of a ${BUDGET} s budget"
	printf '%s\n' "${SUMMARY[@]}"
} | tee "$O/summary.txt"
tar -C "$L" -czf "$O/logs.tar.gz" .
