/* Metrics registry and the workers' HTTP responder: the exact Prometheus text of counters,
 * gauges and a histogram (cumulative buckets, +Inf, sum, count, constant labels, one HELP/TYPE per
 * family even when its series are registered apart), lock-free updates from 4 threads adding up
 * exactly, malformed names refused; then GET /metrics, /health, /ready, 404, 405, a request head
 * over 8 KiB (431) and a malformed request line (400) against httpd on a loopback port. The
 * exposition also passes `promtool check metrics` when promtool is installed. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include "common/base/log.h"
#include "common/net/httpd.h"
#include "common/net/metrics.h"

static int n_fail;
#define CHECK(c)                                                                                             \
	do {                                                                                                 \
		if (!(c)) {                                                                                  \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c);                \
			n_fail++;                                                                            \
		}                                                                                            \
	} while (0)

static struct metric *counter;

static void *adder(void *arg)
{
	for (int i = 0; i < 100000; i++)
		metrics_add(counter, 1);
	return NULL;
}

static const char *expected = "# HELP t_requests_total Requests by outcome\n"
                              "# TYPE t_requests_total counter\n"
                              "t_requests_total{role=\"decode\",outcome=\"ok\"} 3\n"
                              "t_requests_total{role=\"decode\",outcome=\"error\"} 1\n"
                              "# HELP t_blocks_used Blocks in use\n"
                              "# TYPE t_blocks_used gauge\n"
                              "t_blocks_used{role=\"decode\"} 17\n"
                              "# HELP t_step_seconds Step time\n"
                              "# TYPE t_step_seconds histogram\n"
                              "t_step_seconds_bucket{role=\"decode\",le=\"0.0005\"} 1\n"
                              "t_step_seconds_bucket{role=\"decode\",le=\"0.01\"} 3\n"
                              "t_step_seconds_bucket{role=\"decode\",le=\"1\"} 3\n"
                              "t_step_seconds_bucket{role=\"decode\",le=\"+Inf\"} 4\n"
                              "t_step_seconds_sum{role=\"decode\"} 5.0103\n"
                              "t_step_seconds_count{role=\"decode\"} 4\n";

static void test_registry(void)
{
	struct metrics *r = metrics_create("role=\"decode\"");
	struct metric *ok = metrics_counter(r, "t_requests_total", "outcome=\"ok\"", "Requests by outcome");
	struct metric *g = metrics_gauge(r, "t_blocks_used", NULL, "Blocks in use");
	static const double b[] = {0.0005, 0.01, 1};
	struct metric *h = metrics_histogram(r, "t_step_seconds", NULL, "Step time", b, 3);
	/* registered after the others: still rendered with its family */
	struct metric *err = metrics_counter(r, "t_requests_total", "outcome=\"error\"", NULL);
	metrics_add(ok, 2);
	metrics_add(ok, 1);
	metrics_add(err, 1);
	metrics_set(g, 20);
	metrics_add(g, -3);
	metrics_observe(h, 0.0001);
	metrics_observe(h, 0.005);
	metrics_observe(h, 0.0052);
	metrics_observe(h, 5);
	char *text;
	size_t len;
	CHECK(metrics_render(r, &text, &len) == 0);
	CHECK(strcmp(text, expected) == 0);
	if (strcmp(text, expected) != 0)
		fprintf(stderr, "got:\n%s\nexpected:\n%s\n", text, expected);
	if (system("command -v promtool >/dev/null 2>&1") == 0) {
		FILE *f = popen("promtool check metrics", "w");
		CHECK(f != NULL);
		if (f) {
			fputs(text, f);
			CHECK(pclose(f) == 0);
		}
	} else {
		printf("promtool not installed: exposition checked against the expected text only\n");
	}
	free(text);
	CHECK(metrics_counter(r, "bad name", NULL, "x") == NULL);
	CHECK(metrics_counter(r, "9starts_with_digit", NULL, "x") == NULL);
	CHECK(metrics_gauge(r, "ok_name", "a=\"}\"", "x") == NULL);
	static const double bad[] = {1, 1};
	CHECK(metrics_histogram(r, "h2", NULL, "x", bad, 2) == NULL);
	metrics_add(NULL, 1); /* no-ops, no crash */
	metrics_observe(NULL, 1);
	/* concurrent updates */
	counter = metrics_counter(r, "t_concurrent_total", NULL, "x");
	pthread_t th[4];
	for (int i = 0; i < 4; i++)
		pthread_create(&th[i], NULL, adder, NULL);
	for (int i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	CHECK(metrics_value(counter) == 400000);
	metrics_destroy(r);
}

/* ---- httpd: the server runs on a thread's loop, the client is plain sockets ---- */

static struct metrics *reg;
static uv_loop_t hloop;
static struct httpd *server;
static uv_async_t stop_async;
static int port;

static void handler(void *ud, const char *method, const char *path, struct httpd_response *resp)
{
	if (!strcmp(path, "/metrics")) {
		CHECK(metrics_render(reg, &resp->body, &resp->len) == 0);
		resp->status = 200;
	} else if (!strcmp(path, "/ready")) {
		httpd_set_text(resp, 503, "not ready\n");
	} else {
		httpd_set_text(resp, 404, "not found\n");
	}
}

static void stop_cb(uv_async_t *a)
{
	httpd_stop(server);
	uv_close((uv_handle_t *)a, NULL);
}

static void *server_main(void *arg)
{
	uv_run(&hloop, UV_RUN_DEFAULT);
	return NULL;
}

static int request(const char *req, size_t len, char *out, size_t cap)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		close(fd);
		return -1;
	}
	size_t off = 0;
	while (off < len) {
		ssize_t n = write(fd, req + off, len - off);
		if (n <= 0)
			break; /* the server may answer and close before reading it all (431) */
		off += (size_t)n;
	}
	size_t got = 0;
	ssize_t n;
	while (got < cap - 1 && (n = read(fd, out + got, cap - 1 - got)) > 0)
		got += (size_t)n;
	out[got] = 0;
	close(fd);
	return 0;
}

static void test_httpd(void)
{
	reg = metrics_create("role=\"test\"");
	struct metric *g = metrics_gauge(reg, "t_gauge", NULL, "a gauge");
	metrics_set(g, 42);
	uv_loop_init(&hloop);
	struct errbuf e;
	CHECK(httpd_start(&hloop, "127.0.0.1:0", handler, NULL, &server, &e) == 0);
	port = httpd_port(server);
	uv_async_init(&hloop, &stop_async, stop_cb);
	pthread_t th;
	pthread_create(&th, NULL, server_main, NULL);
	static char out[65536];
	const char *get = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
	CHECK(request(get, strlen(get), out, sizeof(out)) == 0);
	CHECK(strncmp(out, "HTTP/1.1 200 OK\r\n", 17) == 0);
	CHECK(strstr(out,
	             "\r\n\r\n# HELP t_gauge a gauge\n# TYPE t_gauge gauge\nt_gauge{role=\"test\"} 42\n") !=
	      NULL);
	const char *ready = "GET /ready?x=1 HTTP/1.0\r\n\r\n";
	CHECK(request(ready, strlen(ready), out, sizeof(out)) == 0 && strncmp(out, "HTTP/1.1 503", 12) == 0);
	const char *nf = "GET /nope HTTP/1.1\r\n\r\n";
	CHECK(request(nf, strlen(nf), out, sizeof(out)) == 0 && strncmp(out, "HTTP/1.1 404", 12) == 0);
	const char *post = "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n";
	CHECK(request(post, strlen(post), out, sizeof(out)) == 0 && strncmp(out, "HTTP/1.1 405", 12) == 0);
	const char *junk = "\x01\x02garbage\r\n\r\n";
	CHECK(request(junk, strlen(junk), out, sizeof(out)) == 0 && strncmp(out, "HTTP/1.1 400", 12) == 0);
	static char big[20000];
	memcpy(big, "GET / HTTP/1.1\r\nX: ", 19);
	memset(big + 19, 'a', sizeof(big) - 19);
	CHECK(request(big, sizeof(big), out, sizeof(out)) == 0 && strncmp(out, "HTTP/1.1 431", 12) == 0);
	const char *head = "HEAD /metrics HTTP/1.1\r\n\r\n";
	CHECK(request(head, strlen(head), out, sizeof(out)) == 0 && strncmp(out, "HTTP/1.1 200", 12) == 0 &&
	      strstr(out, "t_gauge") == NULL);
	uv_async_send(&stop_async);
	pthread_join(th, NULL);
	uv_loop_close(&hloop);
	metrics_destroy(reg);
}

int main(void)
{
	log_init("test", -1);
	test_registry();
	test_httpd();
	if (n_fail) {
		fprintf(stderr, "test_net_metrics: %d checks failed\n", n_fail);
		return 1;
	}
	printf("test_net_metrics: all checks passed\n");
	return 0;
}
