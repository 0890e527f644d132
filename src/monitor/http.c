/* monitor/http.c: the run's HTTP endpoint (libmicrohttpd, its own thread):
 * GET /metrics is the exporter's text, / the live dashboard, /api/run the
 * JSON it draws from. keel binds the socket itself so that
 * a port in use or an address not on this machine is one clear error before
 * training starts; GET and HEAD only (405 for anything else). */
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "keel/monitor.h"

extern const char keel_dashboard_html[]; /* src/monitor/dashboard.html, compiled in (CMakeLists.txt) */

struct keel_metrics_server {
    struct MHD_Daemon *daemon;
    keel_exporter *exporter;
    char url[128];
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

/* A listening TCP socket on bind:port, or -1 with the error set. */
static int listen_on(const char *bind_addr, int port) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICHOST | AI_PASSIVE},
                    *ai;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    int rc = getaddrinfo(bind_addr, service, &hints, &ai);
    if (rc != 0) {
        keel_errorf("metrics.bind \"%s\" is not a numeric IP address (%s): use e.g. 127.0.0.1 or 0.0.0.0",
                    bind_addr, gai_strerror(rc));
        return -1;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one); /* not a second listener: TIME_WAIT */
    if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 64) != 0) {
        int e = errno;
        if (e == EADDRINUSE)
            keel_errorf("metrics.port %d on %s is in use (another keel run on this machine?): set metrics.port "
                        "to a free port, or 0 for no endpoint", port, bind_addr);
        else
            keel_errorf("metrics endpoint %s:%d: cannot listen: %s (metrics.bind, metrics.port)", bind_addr, port,
                        strerror(e));
        if (fd >= 0) close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    return fd;
}

keel_status keel_metrics_serve(const keel_metrics_config *mc, const char *run_dir, keel_metrics_server **out) {
    *out = NULL;
    if (mc->port == 0) return KEEL_OK;
    const char *bind_addr = mc->bind ? mc->bind : "127.0.0.1";
    int fd = listen_on(bind_addr, mc->port);
    if (fd < 0) return KEEL_ERR_INPUT;
    keel_metrics_server *s = keel_xcalloc(sizeof *s, "metrics server");
    s->exporter = keel_exporter_new(run_dir);
    s->daemon = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, 0, NULL, NULL, handle, s,
                                 MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_CONNECTION_TIMEOUT, 10u,
                                 MHD_OPTION_CONNECTION_LIMIT, 32u, MHD_OPTION_END);
    if (!s->daemon) {
        keel_errorf("metrics endpoint %s:%d: libmicrohttpd did not start", bind_addr, mc->port);
        keel_exporter_free(s->exporter);
        close(fd);
        keel_free(s);
        return KEEL_ERR_IO;
    }
    snprintf(s->url, sizeof s->url, "http://%s%s%s:%d/metrics", strchr(bind_addr, ':') ? "[" : "", bind_addr,
             strchr(bind_addr, ':') ? "]" : "", mc->port);
    *out = s;
    return KEEL_OK;
}

const char *keel_metrics_url(const keel_metrics_server *s) { return s ? s->url : NULL; }

void keel_metrics_stop(keel_metrics_server *s) {
    if (!s) return;
    MHD_stop_daemon(s->daemon); /* closes the listening socket too */
    keel_exporter_free(s->exporter);
    keel_free(s);
}
