/* monitor/http.c: the run's HTTP endpoint (libmicrohttpd, its own thread):
 * GET /metrics is the exporter's text, / the live dashboard, /api/run the
 * JSON it draws from. keel binds the socket itself so that a port the user
 * set that is in use, or an address not on this machine, is one clear error
 * before training starts, and a default port in use moves to the next free
 * one; RUN/endpoint.json names the URL served. GET and HEAD only (405 for
 * anything else). */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "keel/monitor.h"
#include "keel/run.h"

extern const char keel_dashboard_html[]; /* src/monitor/dashboard.html, compiled in (CMakeLists.txt) */

struct keel_metrics_server {
    struct MHD_Daemon *daemon;
    keel_exporter *exporter;
    char url[128];
    int port;       /* served: metrics.port, or the free one an unset port moved to */
    char *run_dir;
    bool published; /* RUN/endpoint.json names it (keel_metrics_publish) */
};

static enum MHD_Result reply(struct MHD_Connection *c, unsigned code, const char *type, char *body, bool owned) {
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body,
                                                             owned ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!r) {
        if (owned) free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (code == MHD_HTTP_METHOD_NOT_ALLOWED) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    enum MHD_Result ok = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **state) {
    (void)version, (void)upload, (void)state;
    keel_metrics_server *s = cls;
    if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD)) {
        *upload_size = 0; /* a body is not read: the answer is the same */
        return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain", "keel: only GET and HEAD\n", false);
    }
    if (!strcmp(url, "/metrics"))
        return reply(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", keel_exporter_render(s->exporter),
                     true);
    if (!strcmp(url, "/api/run"))
        return reply(c, MHD_HTTP_OK, "application/json", keel_exporter_json(s->exporter), true);
    if (!strcmp(url, "/"))
        return reply(c, MHD_HTTP_OK, "text/html; charset=utf-8", (char *)keel_dashboard_html, false);
    return reply(c, MHD_HTTP_NOT_FOUND, "text/plain", "keel: / (dashboard), /metrics (Prometheus), /api/run (JSON)\n",
                 false);
}

/* bind_addr with port 0 resolved, or NULL with the error line printed. */
static struct addrinfo *resolve(const char *bind_addr) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICHOST | AI_PASSIVE},
                    *ai;
    int rc = getaddrinfo(bind_addr, "0", &hints, &ai);
    if (rc == 0) return ai;
    keel_errorf("metrics.bind \"%s\" is not a numeric IP address (%s): use e.g. 127.0.0.1 or 0.0.0.0", bind_addr,
                gai_strerror(rc));
    return NULL;
}

/* A listening TCP socket on ai's address and port in *fd: 0, or the errno
 * of the failure (EADDRINUSE: another process listens there). */
static int listen_on(const struct addrinfo *ai, int port, int *fd) {
    struct sockaddr_storage addr;
    memcpy(&addr, ai->ai_addr, ai->ai_addrlen);
    if (ai->ai_family == AF_INET6) ((struct sockaddr_in6 *)&addr)->sin6_port = htons((uint16_t)port);
    else ((struct sockaddr_in *)&addr)->sin_port = htons((uint16_t)port);
    int s = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    if (s < 0) return errno;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one); /* not a second listener: TIME_WAIT */
    if (bind(s, (struct sockaddr *)&addr, ai->ai_addrlen) != 0 || listen(s, 64) != 0) {
        int e = errno;
        close(s);
        return e;
    }
    *fd = s;
    return 0;
}

/* The error line for a port the user set that another process holds: the
 * port, the key, where it was set and the fix. */
static void port_in_use(const keel_config *cfg, const char *bind_addr, int port) {
    const int first = KEEL_METRICS_DEFAULT_PORT, last = first + KEEL_METRICS_PORT_RANGE - 1;
    char line[512];
    snprintf(line, sizeof line, "metrics.port %d on %s is in use (another keel run on this machine?)", port,
             bind_addr);
    switch (keel_config_key_origin(cfg, "metrics.port")) {
    case KEEL_FROM_ENV:
        keel_errorf("%s; it comes from $KEEL_METRICS_PORT: set that to a free port or 0 for no endpoint, or unset "
                    "it to take the first free port of %d-%d", line, first, last);
        break;
    case KEEL_FROM_SET:
        keel_errorf("%s; it comes from --set: give a free port or 0 for no endpoint, or drop the --set to take the "
                    "first free port of %d-%d", line, first, last);
        break;
    default:
        keel_errorf("%s; it is set in %s: set metrics.port to a free port or 0 for no endpoint, or remove it to "
                    "take the first free port of %d-%d", line, cfg->source ? cfg->source : "the config", first, last);
    }
}

/* The port to serve on, listening in *fd: metrics.port, or — when the user
 * did not set it — the first free one of the default range. *fd = -1 with
 * KEEL_OK when the whole range is in use (one warning). */
static keel_status open_port(const keel_config *cfg, const char *bind_addr, int *port, int *fd) {
    *fd = -1;
    struct addrinfo *ai = resolve(bind_addr);
    if (!ai) return KEEL_ERR_INPUT;
    bool movable = keel_config_key_origin(cfg, "metrics.port") == KEEL_FROM_DEFAULT;
    int first = cfg->metrics.port, last = movable ? first + KEEL_METRICS_PORT_RANGE - 1 : first, e = EADDRINUSE;
    if (last > 65535) last = 65535;
    for (*port = first; *port <= last && (e = listen_on(ai, *port, fd)) == EADDRINUSE; ++*port) {}
    freeaddrinfo(ai);
    if (e == 0) return KEEL_OK;
    if (e != EADDRINUSE) {
        keel_errorf("metrics endpoint %s:%d: cannot listen: %s (metrics.bind, metrics.port)", bind_addr, *port,
                    strerror(e));
        return KEEL_ERR_INPUT;
    }
    if (!movable) {
        port_in_use(cfg, bind_addr, first);
        return KEEL_ERR_INPUT;
    }
    keel_log_warn("metrics: ports %d-%d on %s are all in use: this run trains without a metrics endpoint (set "
                  "metrics.port to a free port to serve one; keel status RUN reads the run without it)",
                  first, last, bind_addr);
    return KEEL_OK;
}

keel_status keel_metrics_serve(const keel_config *cfg, const char *run_dir, keel_metrics_server **out) {
    *out = NULL;
    if (cfg->metrics.port == 0) return KEEL_OK;
    const char *bind_addr = cfg->metrics.bind ? cfg->metrics.bind : "127.0.0.1";
    int port, fd;
    keel_status st = open_port(cfg, bind_addr, &port, &fd);
    if (st != KEEL_OK || fd < 0) return st;
    keel_metrics_server *s = keel_xcalloc(sizeof *s, "metrics server");
    s->exporter = keel_exporter_new(run_dir);
    s->daemon = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, 0, NULL, NULL, handle, s,
                                 MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_CONNECTION_TIMEOUT, 10u,
                                 MHD_OPTION_CONNECTION_LIMIT, 32u, MHD_OPTION_END);
    if (!s->daemon) {
        keel_errorf("metrics endpoint %s:%d: libmicrohttpd did not start", bind_addr, port);
        keel_exporter_free(s->exporter);
        close(fd);
        keel_free(s);
        return KEEL_ERR_IO;
    }
    bool v6 = strchr(bind_addr, ':') != NULL;
    snprintf(s->url, sizeof s->url, "http://%s%s%s:%d/metrics", v6 ? "[" : "", bind_addr, v6 ? "]" : "", port);
    s->port = port;
    s->run_dir = keel_xstrdup(run_dir);
    if (port == cfg->metrics.port) keel_log_info("metrics: %s", s->url);
    else
        keel_log_info("metrics: %s (port %d is in use: an unset metrics.port takes the first free one of %d-%d)",
                      s->url, cfg->metrics.port, cfg->metrics.port, cfg->metrics.port + KEEL_METRICS_PORT_RANGE - 1);
    *out = s;
    return KEEL_OK;
}

void keel_metrics_publish(keel_metrics_server *s) {
    if (!s) return;
    char path[4200], node[256];
    keel_run_path(path, sizeof path, s->run_dir, KEEL_RUN_ENDPOINT);
    keel_node_name(node, sizeof node);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "url", s->url);
    cJSON_AddNumberToObject(j, "port", s->port);
    cJSON_AddNumberToObject(j, "pid", (double)getpid());
    cJSON_AddStringToObject(j, "node", node);
    cJSON_AddNumberToObject(j, "unix_s", (double)time(NULL));
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    keel_error_capture(true);
    keel_status st = keel_write_file_atomic2(path, text, strlen(text), "\n", 1);
    keel_error_capture(false);
    free(text);
    if (st == KEEL_OK) s->published = true;
    else keel_log_warn("metrics: %s (the endpoint serves, but RUN/%s does not name it)", keel_last_error(),
                       KEEL_RUN_ENDPOINT);
}

const char *keel_metrics_url(const keel_metrics_server *s) { return s ? s->url : NULL; }

void keel_metrics_stop(keel_metrics_server *s) {
    if (!s) return;
    MHD_stop_daemon(s->daemon); /* closes the listening socket too */
    if (s->published) { /* nothing serves the run now */
        char path[4200];
        keel_run_path(path, sizeof path, s->run_dir, KEEL_RUN_ENDPOINT);
        unlink(path);
    }
    keel_exporter_free(s->exporter);
    keel_free(s->run_dir);
    keel_free(s);
}
