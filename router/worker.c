/* KV-layout comparison used at registration: a prefill and a decode worker can only be paired if
 * every field of the layout agrees, and the refusal must say which field and both values. */
#include "router/worker.h"

#include <stddef.h>
#include <string.h>

int kv_layout_compare(const struct kv_layout *a, const char *a_name, const struct kv_layout *b,
                      const char *b_name, struct errbuf *e)
{
	if (strcmp(a->arch, b->arch) != 0)
		return errbuf_set(e, ERR_MISMATCH, "KV layout differs: arch is %s on %s but %s on %s",
		                  a->arch, a_name, b->arch, b_name);
	if (strcmp(a->dtype, b->dtype) != 0)
		return errbuf_set(e, ERR_MISMATCH, "KV layout differs: dtype is %s on %s but %s on %s",
		                  a->dtype, a_name, b->dtype, b_name);
	static const struct {
		const char *name;
		size_t off;
	} fields[] = {
	    {"n_layers", offsetof(struct kv_layout, n_layers)},
	    {"block_size", offsetof(struct kv_layout, block_size)},
	    {"kv_lora_rank", offsetof(struct kv_layout, kv_lora_rank)},
	    {"rope_dim", offsetof(struct kv_layout, rope_dim)},
	    {"indexer_dim", offsetof(struct kv_layout, indexer_dim)},
	    {"n_indexer_layers", offsetof(struct kv_layout, n_indexer_layers)},
	};
	for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
		uint32_t va, vb;
		memcpy(&va, (const char *)a + fields[i].off, sizeof(va));
		memcpy(&vb, (const char *)b + fields[i].off, sizeof(vb));
		if (va != vb)
			return errbuf_set(e, ERR_MISMATCH, "KV layout differs: %s is %u on %s but %u on %s",
			                  fields[i].name, va, a_name, vb, b_name);
	}
	return 0;
}
