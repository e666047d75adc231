/* Private layout of an open GGUF model, shared by the files of common/gguf (reader, accessors,
 * printer, writer's copy_kv). Nothing outside common/gguf includes this. */
#ifndef TANDEM_GGUF_INTERNAL_H
#define TANDEM_GGUF_INTERNAL_H

#include "common/gguf/gguf.h"

/* Element table of one array whose elements have variable size (strings or arrays): the parser
 * records where every element starts so element access is O(1). */
struct gguf_arr_index {
	const uint8_t **elem; /* start of element i (a string's u64 length / an array's u32 type) */
	int64_t *child; /* arrays of arrays: index id of child i, or -1 (NULL otherwise) */
	uint64_t count;
};

struct gguf_kv_rec {
	char *key; /* NUL-terminated copy */
	enum gguf_vtype type;
	const uint8_t *val; /* raw value bytes in the mapping (after the u32 type) */
	size_t val_len;
	uint64_t file_offset; /* where the kv starts in its file */
	int64_t index; /* ARRAY with variable-size elements: index id, else -1 */
};

/* The keys of one shard, with their lookup table and array indexes. */
struct gguf_kvset {
	struct gguf_kv_rec *kv;
	int64_t n;
	struct gguf_arr_index *idx;
	int64_t n_idx, cap_idx;
	int64_t *slots; /* open-addressing hash of key -> kv index, -1 empty */
	size_t n_slots; /* power of two */
};

struct gguf_shard {
	char *path; /* owned copy (a label like "<memory>" for gguf_open_mem) */
	const uint8_t *map;
	size_t size;
	bool mapped; /* munmap on close */
	uint64_t data_start;
};

struct gguf_ctx {
	uint32_t version;
	size_t alignment;
	struct gguf_shard *shards;
	int n_shards;
	struct gguf_kvset meta; /* shard 0's keys */
	struct gguf_tensor *tensors;
	int64_t n_tensors, cap_tensors;
	int64_t *tslots; /* hash of tensor name -> index, -1 empty */
	size_t n_tslots;
};

/* FNV-1a; shared by the key and tensor tables. */
uint64_t gguf_hash_str(const char *s);
/* Index of `key` in a kvset, -1 if absent. */
int64_t gguf_kvset_find(const struct gguf_kvset *set, const char *key);

/* Size in bytes of one element of a fixed-size value type, 0 for STRING/ARRAY/unknown. */
size_t gguf_vtype_size(enum gguf_vtype t);
/* Checks one serialized value (as stored after the u32 type) like the reader does; 0 or ERR_FORMAT. */
int gguf_value_validate(enum gguf_vtype type, const void *val, size_t len, struct errbuf *e);

#endif
