/* GGUF v3 reader (mmap, bounds-checked) and writer.
 *
 * The reader maps the file read-only and validates everything before anything else looks at it:
 * every length, count and offset is checked against the file size with overflow-checked
 * arithmetic; tensor infos are checked for known type ids, dims <= 4, ne0 a multiple of the type's
 * block size, data ranges inside the data section, aligned, not overlapping, unique names. Split
 * models (`split.count` > 1, files named ...-00001-of-000NN.gguf) are opened as one: given any
 * shard's path, all shards are opened, checked for a consistent split.count / split.no and their
 * tensor tables merged. Errors name the key or tensor and the file (and shard) offset.
 *
 * Ownership: strings and arrays returned by accessors are borrowed from the mapping and live
 * until gguf_close(). Strings in the file are NOT NUL-terminated: accessors return (ptr, len);
 * gguf_get_str_dup() makes a NUL-terminated copy. Key and tensor names ARE returned
 * NUL-terminated (the reader copies them). */
#ifndef TANDEM_GGUF_H
#define TANDEM_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/base/err.h"

#define GGUF_MAX_DIMS 4
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_NAME 256 /* tensor/key names longer than this are a format error */

enum gguf_vtype {
	GGUF_VT_U8 = 0,
	GGUF_VT_I8 = 1,
	GGUF_VT_U16 = 2,
	GGUF_VT_I16 = 3,
	GGUF_VT_U32 = 4,
	GGUF_VT_I32 = 5,
	GGUF_VT_F32 = 6,
	GGUF_VT_BOOL = 7,
	GGUF_VT_STRING = 8,
	GGUF_VT_ARRAY = 9,
	GGUF_VT_U64 = 10,
	GGUF_VT_I64 = 11,
	GGUF_VT_F64 = 12,
	GGUF_VT_COUNT
};

struct gguf_ctx; /* opaque: one model, all shards */

struct gguf_tensor {
	const char *name; /* NUL-terminated copy */
	int type; /* ggml type id (kernels.h enum ktype) */
	int n_dims;
	int64_t ne[GGUF_MAX_DIMS]; /* unused dims are 1 */
	size_t nbytes; /* validated: row bytes * ne1*ne2*ne3 */
	const void *data; /* into the mapping of its shard */
	int shard; /* 0-based shard index */
	uint64_t file_offset; /* absolute offset of the data in its shard file */
};

/* A view of an array value. For fixed-size element types `data` points at `count` packed
 * little-endian elements; for string arrays use gguf_arr_str(); nested arrays use gguf_arr_sub(). */
struct gguf_arr {
	const struct gguf_ctx *g;
	enum gguf_vtype type; /* element type */
	uint64_t count;
	const void *data;
	int64_t kv; /* internal: which kv */
	uint64_t path; /* internal: nesting cursor */
};

int gguf_open(struct gguf_ctx **out, const char *path, struct errbuf *e) TD_MUST_CHECK;
/* Same checks on a GGUF image in memory (borrowed until gguf_close; used by tests and the fuzzer).
 * `label` names it in error messages. Split sets cannot be opened this way. */
int gguf_open_mem(struct gguf_ctx **out, const void *data, size_t size, const char *label,
                  struct errbuf *e) TD_MUST_CHECK;
void gguf_close(struct gguf_ctx *g); /* accepts NULL */

uint32_t gguf_version(const struct gguf_ctx *g);
int gguf_n_shards(const struct gguf_ctx *g);
size_t gguf_alignment(const struct gguf_ctx *g);
const char *gguf_shard_path(const struct gguf_ctx *g, int shard); /* NULL if out of range */
uint64_t gguf_shard_size(const struct gguf_ctx *g, int shard); /* file size in bytes */
const char *gguf_vtype_name(enum gguf_vtype t); /* "u32", "str", "array", ... */

/* Metadata (keys of shard 0, which carries the model metadata; split.* keys of every shard are
 * validated on open). */
int64_t gguf_n_kv(const struct gguf_ctx *g);
int64_t gguf_find_key(const struct gguf_ctx *g, const char *key); /* -1 if absent */
const char *gguf_kv_key(const struct gguf_ctx *g, int64_t i);
enum gguf_vtype gguf_kv_type(const struct gguf_ctx *g, int64_t i);

/* Typed getters by key. Return 0, ERR_NOTFOUND if the key is absent, ERR_FORMAT (with a message
 * naming the key and its actual type) if it has an incompatible type. Integer getters accept any
 * integer type whose value fits; float getters accept F32/F64; bool accepts BOOL (and integers 0/1). */
int gguf_get_u32(const struct gguf_ctx *g, const char *key, uint32_t *out, struct errbuf *e);
int gguf_get_i64(const struct gguf_ctx *g, const char *key, int64_t *out, struct errbuf *e);
int gguf_get_f32(const struct gguf_ctx *g, const char *key, float *out, struct errbuf *e);
int gguf_get_bool(const struct gguf_ctx *g, const char *key, bool *out, struct errbuf *e);
int gguf_get_str(const struct gguf_ctx *g, const char *key, const char **ptr, size_t *len, struct errbuf *e);
char *gguf_get_str_dup(const struct gguf_ctx *g, const char *key, struct errbuf *e); /* malloc'd */
int gguf_get_arr(const struct gguf_ctx *g, const char *key, struct gguf_arr *out, struct errbuf *e);
/* Element i of a string array (validated on open; O(1) after the first call per array). */
const char *gguf_arr_str(const struct gguf_arr *a, uint64_t i, size_t *len);
/* Element i of an array of arrays. */
int gguf_arr_sub(const struct gguf_arr *a, uint64_t i, struct gguf_arr *out);
/* Numeric element i converted to int64/double (any integer/float/bool element type). */
int64_t gguf_arr_int(const struct gguf_arr *a, uint64_t i);
double gguf_arr_float(const struct gguf_arr *a, uint64_t i);

/* Tensors (merged over shards, in file order: shard 0's first). Lookup by exact name. */
int64_t gguf_n_tensors(const struct gguf_ctx *g);
const struct gguf_tensor *gguf_tensor(const struct gguf_ctx *g, int64_t i);
const struct gguf_tensor *gguf_find_tensor(const struct gguf_ctx *g, const char *name);

/* Human-readable dump (used by `tandem inspect`): metadata (long arrays abbreviated) and the
 * tensor table with types, shapes and bytes. */
void gguf_print(const struct gguf_ctx *g, void *stdio_file);

/* ---- writer ------------------------------------------------------------------------------------
 * Collects metadata and tensor descriptions, then writes a GGUF v3 file in one pass. Tensor data
 * is either borrowed (`data`, must live until gguf_writer_write returns) or produced at write time
 * by a callback filling `nbytes` bytes (so files larger than memory can be written). */
struct gguf_writer;
typedef int (*gguf_fill_cb)(void *user, const char *name, void *dst, size_t nbytes);

struct gguf_writer *gguf_writer_create(size_t alignment);
void gguf_writer_destroy(struct gguf_writer *w);
int gguf_writer_set_u32(struct gguf_writer *w, const char *key, uint32_t v);
int gguf_writer_set_i32(struct gguf_writer *w, const char *key, int32_t v);
int gguf_writer_set_u64(struct gguf_writer *w, const char *key, uint64_t v);
int gguf_writer_set_f32(struct gguf_writer *w, const char *key, float v);
int gguf_writer_set_bool(struct gguf_writer *w, const char *key, bool v);
int gguf_writer_set_str(struct gguf_writer *w, const char *key, const char *v);
/* Array of fixed-size elements (type must not be STRING/ARRAY); data copied. */
int gguf_writer_set_arr(struct gguf_writer *w, const char *key, enum gguf_vtype type, const void *data,
                        uint64_t count);
int gguf_writer_set_arr_str(struct gguf_writer *w, const char *key, const char *const *strs, uint64_t count);
/* Copy one key (any type, incl. nested arrays) from an open file. */
int gguf_writer_copy_kv(struct gguf_writer *w, const struct gguf_ctx *g, int64_t kv);
int gguf_writer_add_tensor(struct gguf_writer *w, const char *name, int type, int n_dims, const int64_t *ne,
                           const void *data);
int gguf_writer_add_tensor_cb(struct gguf_writer *w, const char *name, int type, int n_dims,
                              const int64_t *ne, gguf_fill_cb cb, void *user);
/* Streaming variant: the callback is called several times per tensor, each time for a whole
 * number of rows (`offset` and `nbytes` are multiples of the row size, chunks of about
 * `chunk_bytes` or one row if larger), in increasing offset order, so memory stays bounded. */
typedef int (*gguf_fill_chunk_cb)(void *user, const char *name, uint64_t offset, void *dst, size_t nbytes);
int gguf_writer_add_tensor_chunked(struct gguf_writer *w, const char *name, int type, int n_dims,
                                   const int64_t *ne, gguf_fill_chunk_cb cb, void *user);
/* Chunk size for chunked tensors (default 64 MiB). */
void gguf_writer_set_chunk_bytes(struct gguf_writer *w, size_t chunk_bytes);
/* Tensors of at least min_bytes are not generated: their data is a file hole (zeros, no disk
 * space). For synthetic benchmarks whose weights are random device memory (tandem bench
 * --synthetic); 0 (default) writes everything. */
void gguf_writer_set_sparse(struct gguf_writer *w, size_t min_bytes);
/* Progress report after each tensor (bytes written so far, total bytes); NULL to disable. */
typedef void (*gguf_progress_cb)(void *user, uint64_t done, uint64_t total);
void gguf_writer_set_progress(struct gguf_writer *w, gguf_progress_cb cb, void *user);
int gguf_writer_set_i64(struct gguf_writer *w, const char *key, int64_t v);
int gguf_writer_set_u16(struct gguf_writer *w, const char *key, uint16_t v);
/* Any scalar or string value given as raw little-endian bytes (STRING: u64 length + bytes;
 * ARRAY: u32 type + u64 count + elements); used for nested arrays and exotic types. The bytes
 * are validated like the reader validates a file. */
int gguf_writer_set_raw(struct gguf_writer *w, const char *key, enum gguf_vtype type, const void *val,
                        size_t len);
/* Setters return 0, -EEXIST for a key set twice, -EINVAL for a bad key or value, -ENOMEM. The first
 * failure is also remembered and makes gguf_writer_write fail. Writing goes to PATH.tmp, renamed
 * to PATH when complete. */
int gguf_writer_write(struct gguf_writer *w, const char *path, struct errbuf *e) TD_MUST_CHECK;

#endif
