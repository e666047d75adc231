/* mla_attn_dec6.cu's kernel SOURCE run on the CPU, so CI without a GPU checks its indexing, online
 * softmax, tile loop and split merge: every CUDA thread a pthread, __syncthreads a per-block
 * std::barrier, the warp shuffles an exchange behind a per-warp barrier, shared memory a buffer per
 * block, a thread-block cluster a barrier over its blocks with map_shared_rank translating
 * offsets between their buffers, cp.async an immediate copy. test_mla_dec6_sim.sh cuts the device
 * part of kernels/cuda/mla_attn_dec6.cu (from "#define D6_THREADS" to the launch counter) into
 * mla_dec6_body.inc and builds this file around it (with mla_attn_merge.cuh, the merge it shares
 * with mla_dec). Clusters run one after another, in two orders: the outputs must be the same bits
 * (the last-ticket merge must not depend on arrival order) and the tickets back at 0. Launch plans
 * are set here (one tile a block, several with the two-buffer loop, clusters of 1..8, one or many
 * clusters a row, table preloaded or not), checked against a double-precision reference of the
 * CPU op (kcpu_mla_attn_head: softmax(scale q.k) over the row's keys, bad keys left out), with
 * bf16 and fp32 pools, sparse and dense rows, an empty row, a bad block id, a bad position and a
 * key count above max_keys (counted). Races, the memory model and timing need the GPU
 * (tests/ops/test_ops_mla.c). */
#include <pthread.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <vector>

#define KMLA_SIM 1
#define __CUDA_ARCH__ 900
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(x) __attribute__((aligned(x)))
#define KDEP_ENTRY()                                                                                         \
	do {                                                                                                 \
	} while (0)

struct sim_dim {
	unsigned x, y;
};
thread_local sim_dim threadIdx, blockIdx;
struct alignas(16) float4 {
	float x, y, z, w;
};
struct alignas(8) float2 {
	float x, y;
};
struct alignas(16) uint4 {
	uint32_t x, y, z, w;
};
static inline float4 make_float4(float a, float b, float c, float d)
{
	return {a, b, c, d};
}
static inline float2 make_float2(float a, float b)
{
	return {a, b};
}
static inline uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d)
{
	return {a, b, c, d};
}
static inline float __uint_as_float(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}
static inline unsigned atomicAdd(unsigned *p, unsigned v)
{
	return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
static inline void __threadfence()
{
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
}
template <typename T> static inline T __ldcg(const T *p)
{
	return *p;
}
template <typename T> static inline const T *kdep_after(const T *p)
{
	return p;
}
static inline void kdep_prefetch_l2(const void *, size_t)
{
}
struct sim_grid {
	unsigned x;
};
thread_local sim_grid gridDim;
static inline void katt_cp16(void *dst, const void *src)
{
	memcpy(dst, src, 16);
}
static inline void katt_cp_commit()
{
}
template <int N> static inline void katt_cp_wait()
{
}
using std::max;
using std::min;

/* one simulated block: its shared memory and barriers; a cluster: its blocks and barrier */
struct sim_block {
	uint8_t *smem;
	std::barrier<> *bar;
	std::barrier<> *warp_bar[8];
	float slot[8][32];
};
struct sim_cluster {
	int cl;
	sim_block *blocks;
	std::barrier<> *bar;
};
thread_local sim_block *sim_blk;
thread_local sim_cluster *sim_cls;
thread_local std::optional<std::barrier<>::arrival_token> sim_tok;

static inline void __syncthreads()
{
	sim_blk->bar->arrive_and_wait();
}
static inline void __syncwarp()
{
	sim_blk->warp_bar[threadIdx.x / 32]->arrive_and_wait();
}
static inline float __shfl_xor_sync(unsigned, float v, int o)
{
	const int w = threadIdx.x / 32, l = threadIdx.x % 32;
	sim_blk->slot[w][l] = v;
	sim_blk->warp_bar[w]->arrive_and_wait();
	const float r = sim_blk->slot[w][l ^ o];
	sim_blk->warp_bar[w]->arrive_and_wait();
	return r;
}
static inline void kmla_cluster_arrive()
{
	sim_tok.emplace(sim_cls->bar->arrive());
}
static inline void kmla_cluster_wait()
{
	sim_cls->bar->wait(std::move(*sim_tok));
	sim_tok.reset();
}
namespace cooperative_groups
{
struct cluster_group {
	void sync()
	{
		sim_cls->bar->arrive_and_wait();
	}
	unsigned num_blocks() const
	{
		return (unsigned)sim_cls->cl;
	}
	unsigned block_rank() const
	{
		return blockIdx.x % (unsigned)sim_cls->cl;
	}
	template <typename T> T *map_shared_rank(T *p, unsigned r) const
	{
		const ptrdiff_t off = (uint8_t *)p - sim_blk->smem;
		return (T *)(sim_cls->blocks[r].smem + off);
	}
};
static inline cluster_group this_cluster()
{
	return cluster_group();
}
} // namespace cooperative_groups

namespace cg = cooperative_groups;
#include "kernels/cuda/mla_attn_merge.cuh"
#include "kernels/cuda/mla_pool.cuh"
#include "mla_dec6_body.inc"

/* ---------------------------------------------------------------------------------------------- */

typedef void (*sim_kernel)(d6_args);
struct sim_thread_arg {
	sim_kernel fn;
	const d6_args *a;
	sim_block *blk;
	sim_cluster *cls;
	unsigned tx, bx, by, gx;
};
static void *sim_thread(void *p)
{
	const sim_thread_arg *t = (const sim_thread_arg *)p;
	threadIdx.x = t->tx;
	threadIdx.y = 0;
	blockIdx.x = t->bx;
	blockIdx.y = t->by;
	gridDim.x = t->gx;
	sim_blk = t->blk;
	sim_cls = t->cls;
	t->fn(*t->a);
	return NULL;
}

/* the grid (nsplit, nrh) cluster by cluster, in order or reversed */
static int sim_launch(sim_kernel fn, const d6_args &a, int nsplit, int nrh, int cl, size_t smem, bool reverse)
{
	const int ncl = nsplit / cl;
	pthread_attr_t at;
	pthread_attr_init(&at);
	pthread_attr_setstacksize(&at, 256 << 10);
	std::vector<uint8_t> mem((size_t)cl * smem);
	for (int u = 0; u < nrh * ncl; u++) {
		const int k = reverse ? nrh * ncl - 1 - u : u;
		const int y = k / ncl, icl = k % ncl;
		std::fill(mem.begin(), mem.end(), (uint8_t)0xa5); /* stale shared memory */
		std::vector<sim_block> blocks((size_t)cl);
		std::barrier<> cbar(cl * D6_THREADS);
		sim_cluster cls = {cl, blocks.data(), &cbar};
		std::vector<std::barrier<> *> owned;
		for (int b = 0; b < cl; b++) {
			blocks[b].smem = mem.data() + (size_t)b * smem;
			blocks[b].bar = new std::barrier<>(D6_THREADS);
			owned.push_back(blocks[b].bar);
			for (int w = 0; w < 8; w++) {
				blocks[b].warp_bar[w] = new std::barrier<>(32);
				owned.push_back(blocks[b].warp_bar[w]);
			}
		}
		std::vector<sim_thread_arg> args((size_t)cl * D6_THREADS);
		std::vector<pthread_t> th((size_t)cl * D6_THREADS);
		for (int b = 0; b < cl; b++)
			for (int t = 0; t < D6_THREADS; t++) {
				sim_thread_arg &g = args[(size_t)b * D6_THREADS + t];
				g = {fn,          &a,
				     &blocks[b],  &cls,
				     (unsigned)t, (unsigned)(icl * cl + b),
				     (unsigned)y, (unsigned)nsplit};
				if (pthread_create(&th[(size_t)b * D6_THREADS + t], &at, sim_thread, &g)) {
					fprintf(stderr, "pthread_create failed\n");
					exit(1);
				}
			}
		for (auto &t : th)
			pthread_join(t, NULL);
		for (auto *b : owned)
			delete b;
	}
	pthread_attr_destroy(&at);
	return 0;
}

static int n_fail, n_check;
#define CHECK(cond, ...)                                                                                     \
	do {                                                                                                 \
		n_check++;                                                                                   \
		if (!(cond)) {                                                                               \
			n_fail++;                                                                            \
			printf("FAIL %s:%d: ", __FILE__, __LINE__);                                          \
			printf(__VA_ARGS__);                                                                 \
			printf("\n");                                                                        \
		}                                                                                            \
	} while (0)

static uint16_t to_bf16(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float key_val(const uint8_t *row, int bf16, int d)
{
	if (bf16) {
		uint16_t h;
		memcpy(&h, row + 2 * d, 2);
		return __uint_as_float((uint32_t)h << 16);
	}
	float f;
	memcpy(&f, row + 4 * d, 4);
	return f;
}

struct scase {
	const char *name;
	int bf16, H, C, R, KB, n_q;
	std::vector<int> lens; /* per row (decode) */
	int K; /* 0: dense */
	int chunk, cl, ncl; /* plan */
	int tbl_pre; /* table preloaded (tbl_n = ld_blocks) */
	int early;
	int prefill; /* rows of one sequence, qseq / n_keys NULL, pos0 = lens[0] */
	int bad_blk, bad_pos, bad_nk; /* inject: block id of row 0's first key, a position, n_keys */
};

static void run(const scase &sc, uint64_t seed)
{
	std::mt19937_64 rng(seed);
	std::uniform_real_distribution<float> U(-1.0f, 1.0f);
	const int H = sc.H, C = sc.C, dim = sc.C + sc.R, BT = 16, elt = sc.bf16 ? 2 : 4;
	const int n_q = sc.n_q;
	int max_len = 0;
	for (int v : sc.lens)
		max_len = std::max(max_len, v);
	const int ctx_len = sc.prefill ? sc.lens[0] + n_q : max_len;
	const int ld_blocks = ctx_len / BT + 2;
	const int n_tables = sc.prefill ? 1 : n_q;
	const int64_t n_blocks = (int64_t)n_tables * ld_blocks + 3;
	const size_t row_bytes = (size_t)dim * elt, block_bytes = row_bytes * BT + 64, offset = 32;
	std::vector<uint8_t> pool((size_t)n_blocks * block_bytes + 64);
	for (size_t i = 0; i + elt <= pool.size(); i += elt) {
		const float v = U(rng);
		if (sc.bf16) {
			const uint16_t b = to_bf16(v);
			memcpy(&pool[i], &b, 2);
		} else {
			memcpy(&pool[i], &v, 4);
		}
	}
	/* tables: a shuffled permutation of the blocks */
	std::vector<int32_t> perm((size_t)n_blocks), tbl((size_t)n_tables * ld_blocks);
	for (int64_t i = 0; i < n_blocks; i++)
		perm[i] = (int32_t)i;
	std::shuffle(perm.begin(), perm.end(), rng);
	for (size_t i = 0; i < tbl.size(); i++)
		tbl[i] = perm[i];
	std::vector<int32_t> qseq(n_q), nk(n_q);
	const int ld_sel = sc.K > 0 ? sc.K : 1;
	std::vector<int32_t> sel((size_t)n_q * ld_sel, -7);
	for (int i = 0; i < n_q; i++) {
		qseq[i] = sc.prefill ? 0 : i;
		const int vis = sc.prefill ? sc.lens[0] + i + 1 : sc.lens[i];
		if (sc.K > 0) {
			std::vector<int32_t> all(vis);
			for (int j = 0; j < vis; j++)
				all[j] = j;
			std::shuffle(all.begin(), all.end(), rng);
			const int k = std::min(vis, sc.K);
			std::sort(all.begin(), all.begin() + k);
			for (int j = 0; j < k; j++)
				sel[(size_t)i * ld_sel + j] = all[j];
			nk[i] = k;
		} else {
			nk[i] = vis;
		}
	}
	const int64_t max_keys = sc.K > 0 ? sc.K : ctx_len;
	/* injections: which keys the kernel must leave out, and the errors it must count */
	std::vector<std::vector<char>> skip(n_q);
	for (int i = 0; i < n_q; i++)
		skip[i].assign((size_t)std::max(nk[i], 1), 0);
	unsigned want_err = 0;
	auto pos_of = [&](int i, int j) { return sc.K > 0 ? sel[(size_t)i * ld_sel + j] : j; };
	if (sc.bad_blk && nk[0] > 0) {
		const int bi = pos_of(0, 0) / BT;
		tbl[(size_t)qseq[0] * ld_blocks + bi] = (int32_t)n_blocks + 5;
		for (int i = 0; i < n_q; i++)
			for (int j = 0; j < nk[i]; j++)
				if (qseq[i] == qseq[0] && pos_of(i, j) / BT == bi && !skip[i][j]) {
					skip[i][j] = 1;
					want_err++; /* once per head group: below */
				}
	}
	if (sc.bad_pos && sc.K > 0 && nk[0] > 1) {
		const int j = nk[0] - 1;
		if (!skip[0][j])
			want_err++;
		sel[(size_t)j] = ld_blocks * BT + 3;
		skip[0][j] = 1;
	}
	int32_t nk0 = nk[0];
	if (sc.bad_nk && !sc.prefill) { /* a count above max_keys: clamped to it, counted once */
		nk[0] = (int32_t)max_keys + 9;
		nk0 = (int32_t)max_keys;
	}
	const int n_hg = (H + 7) / 8;
	/* each bad key is met once per head group */
	want_err *= (unsigned)n_hg;
	if (sc.bad_nk && !sc.prefill)
		want_err++;

	std::vector<float> q((size_t)n_q * H * dim);
	for (auto &v : q)
		v = U(rng) * 2.0f;
	const float scale = 1.0f / sqrtf((float)dim);
	/* reference (double) */
	std::vector<double> ref((size_t)n_q * H * C, 0.0);
	for (int i = 0; i < n_q; i++) {
		const int n = i == 0 ? nk0 : nk[i];
		for (int h = 0; h < H; h++) {
			const float *qh = &q[((size_t)i * H + h) * dim];
			std::vector<double> s;
			std::vector<const uint8_t *> rows;
			for (int j = 0; j < n; j++) {
				if (j < (int)skip[i].size() && skip[i][j])
					continue;
				const int p = pos_of(i, j);
				const int32_t blk = tbl[(size_t)qseq[i] * ld_blocks + p / BT];
				const uint8_t *r =
				    &pool[(size_t)blk * block_bytes + offset + (size_t)(p % BT) * row_bytes];
				double d = 0;
				for (int e = 0; e < dim; e++)
					d += (double)qh[e] * key_val(r, sc.bf16, e);
				s.push_back(d * scale);
				rows.push_back(r);
			}
			if (s.empty())
				continue;
			const double mx = *std::max_element(s.begin(), s.end());
			double sum = 0;
			for (auto &v : s) {
				v = exp(v - mx);
				sum += v;
			}
			for (size_t t = 0; t < s.size(); t++)
				for (int c = 0; c < C; c++)
					ref[((size_t)i * H + h) * C + c] +=
					    s[t] / sum * key_val(rows[t], sc.bf16, c);
		}
	}

	/* the launch */
	const int nsplit = sc.cl * sc.ncl, nrh = n_q * n_hg;
	const int tbl_n = sc.tbl_pre ? ld_blocks : 0;
	const int stages = sc.chunk > sc.KB ? 2 : 1;
	const d6_carve L = d6_layout((int)row_bytes, dim, sc.KB, stages, sc.chunk, tbl_n, C);
	std::vector<float> out((size_t)n_q * H * C + 4, NAN),
	    ws((size_t)n_q * H * sc.ncl * (C + 2 * sc.cl) + 16);
	std::vector<unsigned> tickets((size_t)nrh * sc.cl, 0);
	unsigned err = 0;
	d6_args a;
	memset(&a, 0, sizeof(a));
	a.pool.base = pool.data();
	a.pool.n_blocks = n_blocks;
	a.pool.block_bytes = block_bytes;
	a.pool.offset = offset;
	a.pool.bt = BT;
	a.pool.bt_shift = sc.KB == 32 ? -1 : 4; /* the 32-key cases take the division path */
	a.dim = dim;
	a.pool.row_bytes = (int)row_bytes;
	a.pool.qseq = sc.prefill ? NULL : qseq.data();
	a.pool.blocks = tbl.data();
	a.n_keys = sc.prefill && sc.K == 0 ? NULL : nk.data();
	a.sel = sc.K > 0 ? sel.data() : NULL;
	a.pool.ld_blocks = ld_blocks;
	a.pos0 = sc.prefill ? sc.lens[0] : 0;
	a.ld_sel = ld_sel;
	a.max_keys = max_keys;
	a.pool.tbl_n = tbl_n;
	a.early = sc.early;
	a.pf_entries = 3; /* the prefetch's indexing runs (the prefetch itself is a no-op here) */
	a.pf_all = sc.K == 0;
	a.q = q.data();
	a.H = H;
	a.C = C;
	a.n_hg = n_hg;
	a.scale = scale;
	a.chunk = sc.chunk;
	a.stages = stages;
	a.mo.out = out.data();
	a.mo.pacc = ws.data();
	a.mo.pml = ws.data() + (size_t)n_q * H * sc.ncl * C;
	a.mo.tickets = tickets.data();
	a.mo.C = C;
	a.mo.ncl = sc.ncl;
	a.err = &err;
	a.L = L;
	a.trace = NULL;
	CHECK((int64_t)nsplit * sc.chunk >= max_keys, "%s: plan covers %d of %lld keys", sc.name,
	      nsplit * sc.chunk, (long long)max_keys);
	const sim_kernel fn = sc.bf16
	                          ? (sc.KB == 32 ? mla_dec6_kernel<32, false> : mla_dec6_kernel<16, false>)
	                          : mla_dec6_kernel<16, true>;
	sim_launch(fn, a, nsplit, nrh, sc.cl, L.total, false);
	double mr = 0, me = 0;
	int64_t nf = 0;
	for (size_t i = 0; i < ref.size(); i++) {
		if (!std::isfinite(out[i])) {
			nf++;
			continue;
		}
		mr = std::max(mr, fabs(ref[i]));
		me = std::max(me, fabs(out[i] - ref[i]));
	}
	CHECK(nf == 0, "%s: %lld outputs not finite (not written?)", sc.name, (long long)nf);
	CHECK(me <= 5e-5 * mr + 1e-30, "%s: max err %.3g, max |ref| %.3g", sc.name, me, mr);
	CHECK(err == want_err, "%s: %u errors counted, want %u", sc.name, err, want_err);
	bool zero = true;
	for (unsigned t : tickets)
		zero = zero && t == 0;
	CHECK(zero, "%s: tickets not back at 0", sc.name);
	/* the clusters the other way round: the same bits */
	std::vector<float> out1 = out;
	std::fill(out.begin(), out.end(), NAN);
	std::fill(ws.begin(), ws.end(), NAN);
	sim_launch(fn, a, nsplit, nrh, sc.cl, L.total, true);
	CHECK(memcmp(out.data(), out1.data(), sizeof(float) * ref.size()) == 0,
	      "%s: other cluster order, other bits", sc.name);

	/* scores mode (mla_attn_dec7.cu's first launch; no clusters): e^(s - m_t) of every key of the
	 * row's list and each KB-key tile's (m_t, sum), against the double reference; a left-out key
	 * (bad block or position) weighs 0, and the same errors are counted */
	{
		const int64_t ld_sc = (max_keys + 3) / 4 * 4, ld_t = (max_keys + sc.KB - 1) / sc.KB;
		std::vector<float> scv((size_t)n_q * H * ld_sc, NAN);
		std::vector<float2> mlv((size_t)n_q * H * ld_t, make_float2(NAN, NAN));
		d6_args b = a;
		b.sc = scv.data();
		b.ml = mlv.data();
		b.ld_sc = ld_sc;
		b.ld_t = ld_t;
		err = 0;
		const sim_kernel fs =
		    sc.bf16
		        ? (sc.KB == 32 ? mla_dec6_kernel<32, false, true> : mla_dec6_kernel<16, false, true>)
		        : mla_dec6_kernel<16, true, true>;
		sim_launch(fs, b, nsplit, nrh, 1, L.total, false);
		CHECK(err == want_err, "%s: scores mode: %u errors counted, want %u", sc.name, err, want_err);
		double pe = 0, me2 = 0;
		int64_t wrong = 0;
		for (int i = 0; i < n_q; i++) {
			const int n = i == 0 ? nk0 : nk[i];
			for (int h = 0; h < H; h++) {
				const float *qh = &q[((size_t)i * H + h) * dim];
				const size_t rh = (size_t)i * H + h;
				for (int t = 0; t * sc.KB < n; t++) {
					const int j0 = t * sc.KB, j1 = std::min(n, j0 + sc.KB);
					std::vector<double> sv(sc.KB, -INFINITY);
					double m = -INFINITY;
					for (int j = j0; j < j1; j++) {
						if (j < (int)skip[i].size() && skip[i][j])
							continue;
						const int p = pos_of(i, j);
						const int32_t blk = tbl[(size_t)qseq[i] * ld_blocks + p / BT];
						const uint8_t *r = &pool[(size_t)blk * block_bytes + offset +
						                         (size_t)(p % BT) * row_bytes];
						double d = 0;
						for (int e = 0; e < dim; e++)
							d += (double)qh[e] * key_val(r, sc.bf16, e);
						sv[j - j0] = d * scale;
						m = std::max(m, sv[j - j0]);
					}
					double l = 0;
					for (int j = j0; j < j1; j++) {
						const double pw = m == -INFINITY ? 0.0 : exp(sv[j - j0] - m);
						l += pw;
						const double e = fabs((double)scv[rh * ld_sc + j] - pw);
						pe = std::max(pe, std::isfinite(e) ? e : INFINITY);
					}
					const float2 g = mlv[rh * ld_t + t];
					if (m == -INFINITY)
						wrong += !(g.x == -INFINITY && g.y == 0.0f);
					else {
						const double e = std::max(fabs(g.x - m) / (1.0 + fabs(m)),
						                          fabs(g.y - l) / l);
						me2 = std::max(me2, std::isfinite(e) ? e : INFINITY);
					}
				}
			}
		}
		CHECK(pe <= 5e-5, "%s: scores mode: e^(s - m_t) off by %.3g", sc.name, pe);
		CHECK(me2 <= 5e-5 && wrong == 0,
		      "%s: scores mode: tile (max, sum) off by %.3g (rel), %lld empty tiles wrong", sc.name,
		      me2, (long long)wrong);
	}
	printf(
	    "%-58s rows %d H %3d keys %5lld plan %4d keys x %2d x %2d: max err %.3g (rel %.2g), %u errors\n",
	    sc.name, n_q, H, (long long)max_keys, sc.chunk, sc.cl, sc.ncl, me, mr > 0 ? me / mr : 0.0, err);
}

int main(int argc, char **argv)
{
	const uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 0x6d6c6136ull;
	printf("mla_dec6 CPU simulation, seed %#llx\n", (unsigned long long)seed);
	/* name, bf16, H, C, R, KB, n_q, lens, K, chunk, cl, ncl, tbl_pre, early, prefill, bad blk/pos/nk */
	const scase cases[] = {
	    {"GLM-5 shape sparse, 1 tile a block, 2 clusters of 8",
	     1,
	     8,
	     512,
	     64,
	     16,
	     1,
	     {700},
	     200,
	     16,
	     8,
	     2,
	     1,
	     1,
	     0,
	     0,
	     0,
	     0},
	    {"GLM-5 shape sparse fp32, 3 tiles a block, 1 cluster",
	     0,
	     8,
	     512,
	     64,
	     16,
	     1,
	     {400},
	     130,
	     48,
	     4,
	     1,
	     1,
	     1,
	     0,
	     0,
	     0,
	     0},
	    {"DS-V3 shape dense H16 KB32 2 rows, table in global",
	     1,
	     16,
	     512,
	     64,
	     32,
	     2,
	     {100, 37},
	     0,
	     32,
	     4,
	     1,
	     0,
	     0,
	     0,
	     0,
	     0,
	     0},
	    {"small C64 R16 H3 dense, empty row, 2 tiles, 2 x 2",
	     1,
	     3,
	     64,
	     16,
	     16,
	     3,
	     {70, 0, 5},
	     0,
	     32,
	     2,
	     2,
	     1,
	     1,
	     0,
	     0,
	     0,
	     0},
	    {"GLM-5 shape sparse 2 rows, bad block + position",
	     1,
	     8,
	     512,
	     64,
	     16,
	     2,
	     {300, 90},
	     64,
	     16,
	     2,
	     2,
	     1,
	     1,
	     0,
	     1,
	     1,
	     0},
	    {"small C96 R32 H20 sparse fp32, key count > max",
	     0,
	     20,
	     96,
	     32,
	     16,
	     2,
	     {90, 60},
	     40,
	     32,
	     1,
	     2,
	     1,
	     0,
	     0,
	     0,
	     0,
	     1},
	    {"prefill rows C64 R16 H8 causal from 40, KB32 2 tiles",
	     1,
	     8,
	     64,
	     16,
	     32,
	     3,
	     {40},
	     0,
	     64,
	     1,
	     1,
	     1,
	     1,
	     1,
	     0,
	     0,
	     0},
	    /* more partials than one batch (8) in the last block: two threads a unit, joined by a shuffle */
	    {"small C64 R16 H8 dense, 10 clusters of 1 (paired last merge)",
	     1,
	     8,
	     64,
	     16,
	     16,
	     1,
	     {150},
	     0,
	     16,
	     1,
	     10,
	     1,
	     1,
	     0,
	     0,
	     0,
	     0},
	    {"small C64 R16 H8 dense fp32, 20 clusters of 1 (2 batches a half)",
	     0,
	     8,
	     64,
	     16,
	     16,
	     2,
	     {300, 17},
	     0,
	     16,
	     1,
	     20,
	     1,
	     1,
	     0,
	     0,
	     0,
	     0},
	    {"C256 R32 H5 sparse, 9 clusters of 4, bad block",
	     1,
	     5,
	     256,
	     32,
	     16,
	     1,
	     {500},
	     280,
	     16,
	     4,
	     9,
	     1,
	     1,
	     0,
	     1,
	     0,
	     0},
	    {"tiny GLM C256 R32 H2 dense bf16, bad block, 4 tiles",
	     1,
	     2,
	     256,
	     32,
	     16,
	     1,
	     {150},
	     0,
	     64,
	     2,
	     2,
	     0,
	     1,
	     0,
	     1,
	     0,
	     0},
	};
	for (const scase &c : cases)
		run(c, seed ^ (uint64_t)c.chunk * 0x9e3779b97f4a7c15ull ^ (uint64_t)c.H);
	printf("%d checks, %d failed\n", n_check, n_fail);
	return n_fail ? 1 : 0;
}
