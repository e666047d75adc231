/* UCX transfer of KV blocks (see kvx.h). One UCP context and worker per struct kvx, single-thread
 * mode. Puts are fire-and-forget (the request is released at once); kvx_flush() is the one place
 * that waits, with a deadline, and it is what gives remote completion: after it returns 0 the
 * bytes are in the target's memory, so the completion message that follows cannot overtake them.
 *
 * Peer life cycle: kvx_peer_get creates (endpoint with peer error handling + unpacked rkey) or
 * finds a cached peer; a failed flush or a peer error marks it failed and kvx_flush drops it
 * (endpoint closed, then rkey destroyed); the next kvx_peer_get for that address reconnects.
 *
 * A dropped peer's endpoint may outlive it inside UCX: UCX refuses a force close of an endpoint
 * without peer error handling (the default here), and a plain close of one whose peer died may
 * never complete. So the error handler gets the kvx, not the peer, and finds the peer by its
 * endpoint (a dropped peer's struct is freed: writing its `failed` field corrupted the heap), and
 * the rkey of an endpoint whose close did not complete is kept until kvx_destroy (its stuck puts
 * still reference it). */
#include "common/net/kvx.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ucp/api/ucp.h>

#include "common/base/log.h"

#define PEERS_MAX 256
#define ADDR_BLOB_MAX 4096

struct kvx_region {
	ucp_mem_h memh;
	void *rkey_buf;
	size_t rkey_len;
	uintptr_t base;
	size_t len;
	struct kvx_region *next;
};

struct kvx_peer {
	ucp_ep_h ep;
	ucp_rkey_h rkey;
	uint8_t *addr;
	size_t addr_len;
	uint8_t *rkey_blob;
	size_t rkey_len;
	ucs_status_t failed; /* set by the error handler */
	bool peer_mode; /* created with UCP_ERR_HANDLING_MODE_PEER (force close allowed) */
	uint64_t id;
	char transports[256];
	struct kvx_peer *next;
};

struct kvx {
	ucp_context_h ctx;
	ucp_worker_h worker;
	ucp_address_t *addr;
	size_t addr_len;
	int efd;
	bool want_rdma;
	bool peer_failure;
	char transports[512];
	struct kvx_region *regions;
	struct kvx_peer *peers;
	int n_peers;
	/* rkeys of dropped peers whose endpoint close did not complete (see the header) */
	ucp_rkey_h *parked;
	size_t n_parked, cap_parked;
	uint64_t next_peer_id;
	uint64_t bytes_put;
};

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Collects the distinct "transport/device" names from ucp_context_print_info, e.g.
 * "tcp/lo posix/memory self/memory". The format is UCX's human output; we only look for
 * "tl_name/dev_name" tokens on lines that name resources, and fall back to "unknown". */
static void summarize_resources(struct kvx *x)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	x->transports[0] = 0;
	if (!f)
		return;
	ucp_context_print_info(x->ctx, f);
	fclose(f);
	size_t n = 0;
	for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
		/* lines like "#      resource 0  :  md 0  dev 0  flags -- tcp/lo" */
		if (!strstr(line, "resource"))
			continue;
		char *last = strrchr(line, ' ');
		if (!last || !strchr(last, '/'))
			continue;
		last++;
		if (strstr(x->transports, last))
			continue;
		int w = snprintf(x->transports + n, sizeof(x->transports) - n, "%s%s", n ? " " : "", last);
		if (w < 0 || (size_t)w >= sizeof(x->transports) - n)
			break;
		n += (size_t)w;
	}
	free(buf);
	if (!x->transports[0])
		snprintf(x->transports, sizeof(x->transports), "unknown");
}

static bool is_rdma_name(const char *s);

int kvx_create(struct kvx **out, const struct kvx_opts *o, struct errbuf *e)
{
	int rc = 0;
	ucs_status_t st;
	ucp_config_t *cfg = NULL;
	struct kvx *x = calloc(1, sizeof(*x));
	*out = NULL;
	if (!x)
		return errbuf_set(e, -ENOMEM, "out of memory");
	x->efd = -1;
	x->want_rdma = o && o->want_rdma;
	x->peer_failure = o && o->peer_failure;
	st = ucp_config_read(NULL, NULL, &cfg);
	if (st != UCS_OK) {
		rc = errbuf_set(e, ERR_UCX, "UCX: cannot read configuration: %s", ucs_status_string(st));
		goto fail;
	}
	if (o && o->tls && o->tls[0] && (st = ucp_config_modify(cfg, "TLS", o->tls)) != UCS_OK) {
		rc =
		    errbuf_set(e, ERR_UCX, "UCX: bad transport list '%s': %s", o->tls, ucs_status_string(st));
		goto fail_cfg;
	}
	if (o && o->net_devices && o->net_devices[0] &&
	    (st = ucp_config_modify(cfg, "NET_DEVICES", o->net_devices)) != UCS_OK) {
		rc = errbuf_set(e, ERR_UCX, "UCX: bad device list '%s': %s", o->net_devices,
		                ucs_status_string(st));
		goto fail_cfg;
	}
	ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES,
	                  .features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP};
	st = ucp_init(&p, cfg, &x->ctx);
	if (st != UCS_OK) {
		rc = errbuf_set(e, ERR_UCX, "UCX: ucp_init failed: %s (UCX_TLS=%s)", ucs_status_string(st),
		                o && o->tls ? o->tls : "default");
		goto fail_cfg;
	}
	ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
	                          .thread_mode = UCS_THREAD_MODE_SINGLE};
	st = ucp_worker_create(x->ctx, &wp, &x->worker);
	if (st != UCS_OK) {
		rc = errbuf_set(e, ERR_UCX, "UCX: cannot create a worker: %s", ucs_status_string(st));
		goto fail_ctx;
	}
	st = ucp_worker_get_address(x->worker, &x->addr, &x->addr_len);
	if (st != UCS_OK || x->addr_len > ADDR_BLOB_MAX) {
		rc = errbuf_set(e, ERR_UCX, "UCX: cannot get the worker address (%s, %zu bytes)",
		                ucs_status_string(st), x->addr_len);
		goto fail_worker;
	}
	st = ucp_worker_get_efd(x->worker, &x->efd);
	if (st != UCS_OK) {
		rc = errbuf_set(e, ERR_UCX, "UCX: no event fd: %s", ucs_status_string(st));
		goto fail_addr;
	}
	ucp_config_release(cfg);
	summarize_resources(x);
	if (x->want_rdma && !is_rdma_name(x->transports))
		LOG_WARN(
		    "kvx",
		    "*** RDMA was configured but UCX offers no RDMA transport (only: %s): KV transfers will "
		    "use a slower one (check UCX_TLS / UCX_NET_DEVICES and the RDMA devices) ***",
		    x->transports);
	*out = x;
	return 0;

fail_addr:
	ucp_worker_release_address(x->worker, x->addr);
fail_worker:
	ucp_worker_destroy(x->worker);
fail_ctx:
	ucp_cleanup(x->ctx);
fail_cfg:
	ucp_config_release(cfg);
fail:
	free(x);
	return rc;
}

static ucp_rkey_h *realloc_rkeys(ucp_rkey_h *a, size_t *cap)
{
	size_t n = *cap ? *cap * 2 : 8;
	ucp_rkey_h *b = realloc(a, n * sizeof(*b));
	if (b)
		*cap = n;
	else
		free(a);
	return b;
}

/* Closes an endpoint: force (pending operations cancelled) where UCX allows it, else a plain
 * close. Waits up to wait_ms; returns true when the endpoint is gone, false when its close is
 * still in progress (UCX finishes it in the background; it never calls the error handler of a
 * closed endpoint). */
static bool ep_close(struct kvx *x, ucp_ep_h ep, bool force, uint32_t wait_ms)
{
	ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
	                           .flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0};
	void *req = ucp_ep_close_nbx(ep, &prm);
	if (UCS_PTR_IS_ERR(req) && force) {
		/* refused (no peer error handling on this endpoint): the endpoint is untouched */
		prm.flags = 0;
		req = ucp_ep_close_nbx(ep, &prm);
	}
	if (!UCS_PTR_IS_PTR(req))
		return true; /* closed at once, or failed with its resources released (ucp.h) */
	uint64_t deadline = now_ms() + wait_ms;
	while (ucp_request_check_status(req) == UCS_INPROGRESS && now_ms() < deadline)
		ucp_worker_progress(x->worker);
	bool done = ucp_request_check_status(req) != UCS_INPROGRESS;
	ucp_request_free(req);
	return done;
}

static void peer_drop(struct kvx *x, struct kvx_peer *p)
{
	struct kvx_peer **pp = &x->peers;
	while (*pp && *pp != p)
		pp = &(*pp)->next;
	if (*pp)
		*pp = p->next, x->n_peers--;
	/* the endpoint first: its pending puts reference the rkey */
	bool closed = !p->ep || ep_close(x, p->ep, p->peer_mode, 1000);
	if (p->rkey) {
		if (closed) {
			ucp_rkey_destroy(p->rkey);
		} else if (x->n_parked < x->cap_parked ||
		           (x->parked = realloc_rkeys(x->parked, &x->cap_parked)) != NULL) {
			x->parked[x->n_parked++] = p->rkey;
			LOG_WARN("kvx",
			         "UCX endpoint close to a failed decode worker still in progress after "
			         "1 s: its remote key is kept until exit");
		} else {
			x->cap_parked = x->n_parked = 0; /* out of memory: leak the key rather than free it */
		}
	}
	free(p->addr);
	free(p->rkey_blob);
	free(p);
}

void kvx_destroy(struct kvx *x)
{
	if (!x)
		return;
	while (x->peers)
		peer_drop(x, x->peers);
	/* the worker still exists here (a pooled rkey goes back to its memory pool) */
	for (size_t i = 0; i < x->n_parked; i++)
		ucp_rkey_destroy(x->parked[i]);
	free(x->parked);
	while (x->regions)
		kvx_region_unmap(x, x->regions);
	ucp_worker_release_address(x->worker, x->addr);
	ucp_worker_destroy(x->worker);
	ucp_cleanup(x->ctx);
	free(x);
}

void kvx_worker_address(const struct kvx *x, const uint8_t **addr, size_t *len)
{
	*addr = (const uint8_t *)x->addr;
	*len = x->addr_len;
}

const char *kvx_transports(const struct kvx *x)
{
	return x->transports;
}
int kvx_efd(const struct kvx *x)
{
	return x->efd;
}
uint64_t kvx_bytes_put(const struct kvx *x)
{
	return x->bytes_put;
}

int kvx_arm(struct kvx *x)
{
	ucs_status_t st = ucp_worker_arm(x->worker);
	if (st == UCS_OK)
		return 0;
	if (st == UCS_ERR_BUSY)
		return 1;
	return ERR_UCX;
}

int kvx_progress(struct kvx *x)
{
	int n = 0;
	while (ucp_worker_progress(x->worker))
		n++;
	return n;
}

int kvx_region_map(struct kvx *x, void *base, size_t len, struct kvx_region **out, struct errbuf *e)
{
	*out = NULL;
	if (!base || !len)
		return errbuf_set(e, -EINVAL, "UCX: cannot map an empty region");
	struct kvx_region *r = calloc(1, sizeof(*r));
	if (!r)
		return errbuf_set(e, -ENOMEM, "out of memory");
	ucp_mem_map_params_t mp = {.field_mask =
	                               UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
	                           .address = base,
	                           .length = len};
	ucs_status_t st = ucp_mem_map(x->ctx, &mp, &r->memh);
	if (st != UCS_OK) {
		free(r);
		return errbuf_set(e, ERR_UCX, "UCX: cannot register %zu bytes at %p: %s", len, base,
		                  ucs_status_string(st));
	}
	st = ucp_rkey_pack(x->ctx, r->memh, &r->rkey_buf, &r->rkey_len);
	if (st != UCS_OK) {
		ucp_mem_unmap(x->ctx, r->memh);
		free(r);
		return errbuf_set(e, ERR_UCX, "UCX: cannot pack the remote key: %s", ucs_status_string(st));
	}
	r->base = (uintptr_t)base;
	r->len = len;
	r->next = x->regions;
	x->regions = r;
	*out = r;
	return 0;
}

int kvx_region_alloc(struct kvx *x, size_t len, void **base, struct kvx_region **out, struct errbuf *e)
{
	*out = NULL;
	*base = NULL;
	if (!len)
		return errbuf_set(e, -EINVAL, "UCX: cannot allocate an empty region");
	struct kvx_region *r = calloc(1, sizeof(*r));
	if (!r)
		return errbuf_set(e, -ENOMEM, "out of memory");
	ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
	                                         UCP_MEM_MAP_PARAM_FIELD_LENGTH |
	                                         UCP_MEM_MAP_PARAM_FIELD_FLAGS,
	                           .address = NULL,
	                           .length = len,
	                           .flags = UCP_MEM_MAP_ALLOCATE};
	ucs_status_t st = ucp_mem_map(x->ctx, &mp, &r->memh);
	if (st != UCS_OK) {
		free(r);
		return errbuf_set(e, ERR_UCX, "UCX: cannot allocate and register %zu bytes: %s", len,
		                  ucs_status_string(st));
	}
	ucp_mem_attr_t attr = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH};
	st = ucp_mem_query(r->memh, &attr);
	if (st == UCS_OK && attr.length >= len)
		st = ucp_rkey_pack(x->ctx, r->memh, &r->rkey_buf, &r->rkey_len);
	else if (st == UCS_OK)
		st = UCS_ERR_NO_MEMORY;
	if (st != UCS_OK) {
		ucp_mem_unmap(x->ctx, r->memh);
		free(r);
		return errbuf_set(e, ERR_UCX, "UCX: allocated region unusable: %s", ucs_status_string(st));
	}
	memset(attr.address, 0, len);
	r->base = (uintptr_t)attr.address;
	r->len = len;
	r->next = x->regions;
	x->regions = r;
	*base = attr.address;
	*out = r;
	return 0;
}

void kvx_region_rkey(const struct kvx_region *r, const uint8_t **rkey, size_t *len)
{
	*rkey = r->rkey_buf;
	*len = r->rkey_len;
}

void kvx_region_unmap(struct kvx *x, struct kvx_region *r)
{
	if (!r)
		return;
	struct kvx_region **pp = &x->regions;
	while (*pp && *pp != r)
		pp = &(*pp)->next;
	if (*pp)
		*pp = r->next;
	ucp_rkey_buffer_release(r->rkey_buf);
	ucp_mem_unmap(x->ctx, r->memh);
	free(r);
}

/* arg is the kvx: the peer is looked up by its endpoint, since UCX may report an error on the
 * endpoint of a peer that was already dropped and freed (see the header). */
static void peer_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
	struct kvx *x = arg;
	for (struct kvx_peer *p = x->peers; p; p = p->next)
		if (p->ep == ep) {
			p->failed = status;
			LOG_WARN("kvx", "UCX endpoint to peer failed: %s", ucs_status_string(status));
			return;
		}
	LOG_DEBUG("kvx", "UCX endpoint of a dropped peer failed: %s", ucs_status_string(status));
}

/* Which transports carry the endpoint's lanes, from ucp_ep_print_info (human-readable UCX output:
 * lines like "#                 lane[0]:  8:tcp/lo.0 md[4]  -> md[4]/tcp/sysdev[255] rma_bw#0 ..."). */
static void describe_lanes(struct kvx *x, struct kvx_peer *p)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	p->transports[0] = 0;
	if (!f)
		return;
	ucp_ep_print_info(p->ep, f);
	fclose(f);
	if (getenv("TANDEM_KVX_DUMP")) /* debugging aid: UCX's own description of the endpoint */
		fputs(buf, stderr);
	size_t n = 0;
	for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
		char *lane = strstr(line, "lane[");
		if (!lane)
			continue;
		char *colon = strchr(lane, ':');
		if (!colon)
			continue;
		char tl[64];
		/* "  8:tcp/lo.0 md[4]": skip spaces and the resource index */
		const char *s = colon + 1;
		while (*s == ' ')
			s++;
		const char *c2 = strchr(s, ':');
		if (c2 && c2 - s < 6)
			s = c2 + 1;
		if (sscanf(s, "%63s", tl) != 1)
			continue;
		if (strstr(p->transports, tl))
			continue;
		int w =
		    snprintf(p->transports + n, sizeof(p->transports) - n, "%s%s", n ? " " : "lanes: ", tl);
		if (w < 0 || (size_t)w >= sizeof(p->transports) - n)
			break;
		n += (size_t)w;
	}
	free(buf);
	if (!p->transports[0])
		snprintf(p->transports, sizeof(p->transports), "lanes: unknown");
	(void)x;
}

static bool is_rdma_name(const char *s)
{
	return strstr(s, "rc_") || strstr(s, "ud_") || strstr(s, "dc_") || strstr(s, "rc/") ||
	       strstr(s, "ud/") || strstr(s, "dc/") || strstr(s, "mlx");
}

int kvx_peer_get(struct kvx *x, const uint8_t *addr, size_t addr_len, const uint8_t *rkey, size_t rkey_len,
                 struct kvx_peer **out, struct errbuf *e)
{
	*out = NULL;
	if (!addr || !addr_len || addr_len > ADDR_BLOB_MAX || !rkey || !rkey_len || rkey_len > ADDR_BLOB_MAX)
		return errbuf_set(
		    e, -EINVAL, "UCX: peer address (%zu bytes) or remote key (%zu bytes) missing or too long",
		    addr_len, rkey_len);
	for (struct kvx_peer *p = x->peers; p; p = p->next)
		if (p->addr_len == addr_len && p->rkey_len == rkey_len && !memcmp(p->addr, addr, addr_len) &&
		    !memcmp(p->rkey_blob, rkey, rkey_len) && p->failed == UCS_OK) {
			*out = p;
			return 0;
		}
	if (x->n_peers >= PEERS_MAX) {
		/* drop the oldest (tail) peer: a pool of decode workers larger than this is unusual */
		struct kvx_peer *t = x->peers;
		while (t->next)
			t = t->next;
		peer_drop(x, t);
	}
	int rc = 0;
	struct kvx_peer *p = calloc(1, sizeof(*p));
	if (!p)
		return errbuf_set(e, -ENOMEM, "out of memory");
	p->addr = malloc(addr_len);
	p->rkey_blob = malloc(rkey_len);
	if (!p->addr || !p->rkey_blob) {
		rc = errbuf_set(e, -ENOMEM, "out of memory");
		goto fail;
	}
	memcpy(p->addr, addr, addr_len);
	p->addr_len = addr_len;
	memcpy(p->rkey_blob, rkey, rkey_len);
	p->rkey_len = rkey_len;
	/* The address blob comes from a peer (through the router): UCX parses it. It is at least
	 * length-checked here; UCX rejects malformed addresses with an error status. */
	/* Peer-failure detection (PEER mode) only when asked for: shared-memory transports have none,
	 * and asking for it would make UCX exclude them even between two processes on one host. The
	 * error handler is registered either way: a peer whose tcp connection resets is reported. */
	bool peer_mode = x->peer_failure && (strstr(x->transports, "tcp") || is_rdma_name(x->transports));
	ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
	                                    UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
	                                    UCP_EP_PARAM_FIELD_ERR_HANDLER,
	                      .address = (const ucp_address_t *)p->addr,
	                      .err_mode = peer_mode ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE,
	                      .err_handler = {.cb = peer_err_cb, .arg = x}};
	ucs_status_t st = ucp_ep_create(x->worker, &ep, &p->ep);
	p->peer_mode = peer_mode && st == UCS_OK;
	if (st != UCS_OK && peer_mode) {
		/* no transport to this peer detects failures: connect without it; the flush deadline
		 * still bounds every wait */
		ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
		ep.field_mask &= ~(uint64_t)UCP_EP_PARAM_FIELD_ERR_HANDLER;
		st = ucp_ep_create(x->worker, &ep, &p->ep);
		if (st == UCS_OK)
			LOG_INFO("kvx",
			         "UCX endpoint without peer-failure detection (the transport has none)");
	}
	if (st != UCS_OK) {
		p->ep = NULL;
		rc = errbuf_set(e, ERR_UCX, "UCX: cannot create an endpoint to the decode worker: %s",
		                ucs_status_string(st));
		goto fail;
	}
	st = ucp_ep_rkey_unpack(p->ep, p->rkey_blob, &p->rkey);
	if (st != UCS_OK) {
		p->rkey = NULL;
		rc = errbuf_set(e, ERR_UCX, "UCX: cannot unpack the decode worker's remote key: %s",
		                ucs_status_string(st));
		goto fail;
	}
	describe_lanes(x, p);
	LOG_INFO("kvx", "UCX endpoint to decode worker: %s", p->transports);
	if (x->want_rdma && !is_rdma_name(p->transports))
		LOG_WARN(
		    "kvx",
		    "*** RDMA was configured but the endpoint uses %s: KV transfers fall back to a slower "
		    "transport (check UCX_TLS / UCX_NET_DEVICES and the RDMA devices) ***",
		    p->transports);
	p->id = ++x->next_peer_id;
	p->next = x->peers;
	x->peers = p;
	x->n_peers++;
	*out = p;
	return 0;
fail:
	/* never linked into x->peers; p->rkey is NULL here (unpacking it is the last step) */
	peer_drop(x, p);
	return rc;
}

const char *kvx_peer_transports(const struct kvx_peer *p)
{
	return p->transports;
}
uint64_t kvx_peer_id(const struct kvx_peer *p)
{
	return p->id;
}

struct kvx_peer *kvx_peer_by_id(struct kvx *x, uint64_t id)
{
	for (struct kvx_peer *p = x->peers; p; p = p->next)
		if (p->id == id)
			return p;
	return NULL;
}

void kvx_peer_close(struct kvx *x, uint64_t id)
{
	struct kvx_peer *p = kvx_peer_by_id(x, id);
	if (p) {
		LOG_WARN("kvx", "force-closing the UCX endpoint to a decode worker (%s)", p->transports);
		peer_drop(x, p);
	}
}

int kvx_put(struct kvx *x, struct kvx_peer *p, const void *local, const struct kvx_region *lr, size_t len,
            uint64_t remote_addr, struct errbuf *e)
{
	if (p->failed != UCS_OK)
		return errbuf_set(e, ERR_UCX, "UCX: peer already failed: %s", ucs_status_string(p->failed));
	ucp_request_param_t prm = {0};
	if (lr && (uintptr_t)local >= lr->base && (uintptr_t)local + len <= lr->base + lr->len) {
		prm.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
		prm.memh = lr->memh;
	}
	void *req = ucp_put_nbx(p->ep, local, len, remote_addr, p->rkey, &prm);
	if (UCS_PTR_IS_ERR(req))
		return errbuf_set(e, ERR_UCX, "UCX: put of %zu bytes failed: %s", len,
		                  ucs_status_string(UCS_PTR_STATUS(req)));
	if (req)
		ucp_request_free(req); /* completes in the background; kvx_flush waits for all of them */
	x->bytes_put += len;
	return 0;
}

int kvx_flush(struct kvx *x, struct kvx_peer *p, uint32_t timeout_ms, struct errbuf *e)
{
	int rc = 0;
	ucp_request_param_t prm = {0};
	void *req = ucp_ep_flush_nbx(p->ep, &prm);
	if (UCS_PTR_IS_ERR(req)) {
		rc = errbuf_set(e, ERR_UCX, "UCX: flush failed: %s", ucs_status_string(UCS_PTR_STATUS(req)));
		goto drop;
	}
	if (!req)
		return p->failed == UCS_OK
		           ? 0
		           : errbuf_set(e, ERR_UCX, "UCX: peer failed: %s", ucs_status_string(p->failed));
	uint64_t deadline = now_ms() + timeout_ms;
	ucs_status_t st;
	/* The deadline is checked on every turn: an endpoint to a stopped or dead peer can keep
	 * ucp_worker_progress busy (wireup/pending retries), and a check only on idle turns let a
	 * 1 s flush run until UCX's own endpoint timeout, or for good (shared memory). */
	while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS) {
		if (now_ms() >= deadline)
			break;
		if (ucp_worker_progress(x->worker))
			continue;
		/* nothing to do right now: sleep on the event fd until something arrives (or 1 ms) */
		if (ucp_worker_arm(x->worker) == UCS_OK) {
			struct pollfd pfd = {.fd = x->efd, .events = POLLIN};
			poll(&pfd, 1, 1);
		}
	}
	if (st == UCS_INPROGRESS) {
		/* a flush request cannot be cancelled (ucp_request_cancel is for receives): free it
		 * (UCX releases it when it completes) and drop the peer, which closes the endpoint */
		ucp_request_free(req);
		rc = errbuf_set(e, ERR_TIMEOUT,
		                "UCX: KV transfer not complete after %u ms (decode worker unreachable?)",
		                timeout_ms);
		goto drop;
	}
	ucp_request_free(req);
	if (st != UCS_OK || p->failed != UCS_OK) {
		rc = errbuf_set(e, ERR_UCX, "UCX: KV transfer failed: %s",
		                ucs_status_string(st != UCS_OK ? st : p->failed));
		goto drop;
	}
	return 0;
drop:
	peer_drop(x, p);
	return rc;
}
