/* monitor/http.c: the run's HTTP endpoint (libmicrohttpd, on a thread of its
 * own): GET /metrics is the exporter's text, / the live dashboard, /api/run
 * the JSON it draws from. keel binds the socket itself so that a port the
 * user set that is in use, or an address not on this machine, is one clear
 * error before training starts, and a default port in use moves to the next
 * free one; RUN/endpoint.json names the URL served. GET and HEAD only (405
 * for anything else). Clients cannot take it over: a request has a deadline
 * (the whole of it, however slowly its bytes come) and so has its answer,
 * one remote address holds a bounded share of the connections, the dashboard and its API answer only requests
 * addressed to this machine's names (DNS rebinding), and libmicrohttpd's
 * messages go through keel's log, rate-limited (docs/security.md). */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "keel/monitor.h"
#include "keel/run.h"

extern const char keel_dashboard_html[]; /* src/monitor/dashboard.html, compiled in (CMakeLists.txt) */

/* What keeps the endpoint serving while clients misbehave. The clients a run
 * has are a Prometheus or two and a person's browser (up to 6 connections to
 * a host); a scrape or a page load is one small request that arrives in one
 * packet and is answered in about a millisecond. */
enum {
    SLOTS = 128,             /* connections at once: ten legitimate ones and room to spare, at a cost of
                                128 descriptors and at most 4 MiB of libmicrohttpd's 32 KiB per connection */
    SLOTS_PER_ADDRESS = 16,  /* held by one remote address; loopback is exempt (every local client shares
                                it, so a cap there would let one local process lock out the others) */
    REQUEST_DEADLINE_S = 5,  /* a whole request, from the connection or the previous answer: libmicrohttpd's
                                own timeout restarts at every byte, so a byte a second held a slot forever */
    ANSWER_DEADLINE_S = 60,  /* an answer taken by the client, from its request: 6 MB of /api/run at 1 Mbit/s */
    IDLE_TIMEOUT_S = 10,     /* libmicrohttpd's: nothing moved either way */
    LOG_EVERY_S = 60,        /* a line of one kind at most this often; the next says how many were held back */
    LOG_KINDS = 32,
};

typedef struct {
    struct MHD_Connection *c; /* NULL: a free entry */
    int fd;
    unsigned char addr[16];   /* the client's address, IPv4 as ::ffff:a.b.c.d */
    bool answering;           /* between a request and its answer taken */
    bool cut;                 /* shut down at its deadline: libmicrohttpd closes it */
    int answered;             /* requests answered on it */
    double deadline_s;        /* keel_now_s() by which the request or the answer is done */
} connection;

typedef struct {
    const char *kind;         /* a format string: the same message with other values */
    double last_s;            /* keel_now_s() of its last line */
    long held_back;           /* lines of it not written since */
    char newest[300];         /* the newest of them, for the count at the end */
} log_kind;

/* The connections, the log kinds and the daemon are touched by the serving
 * thread only (and by keel_metrics_serve and keel_metrics_stop while that
 * thread is not running): there are no locks. */
struct keel_metrics_server {
    struct MHD_Daemon *daemon;
    keel_exporter *exporter;
    char url[128];
    int port;       /* served: metrics.port, or the free one an unset port moved to */
    char *run_dir;
    bool published; /* RUN/endpoint.json names it (keel_metrics_publish) */
    pthread_t thread;
    int epoll_fd;   /* libmicrohttpd's: readable when it has work */
    int wake[2];    /* a byte on wake[1] ends the serving thread */
    char **hosts;   /* NULL-terminated: the Host names the dashboard and /api/run answer to */
    connection conns[SLOTS];
    log_kind kinds[LOG_KINDS];
};

/* ---- the log: libmicrohttpd's lines and the endpoint's own, rate-limited ---- */

static const char KIND_REQUEST_DEADLINE[] = "request deadline", KIND_ANSWER_DEADLINE[] = "answer deadline",
                  KIND_ADDRESS_FULL[] = "address full", KIND_HOST[] = "host refused";

static log_kind *kind_of(keel_metrics_server *s, const char *kind) {
    for (int i = 0; i < LOG_KINDS - 1; i++) {
        if (s->kinds[i].kind == kind) return &s->kinds[i];
        if (!s->kinds[i].kind) {
            s->kinds[i].kind = kind;
            return &s->kinds[i];
        }
    }
    return &s->kinds[LOG_KINDS - 1]; /* every further kind shares the last */
}

/* "keel: warn: metrics: <text>", unless a line of this kind went out less
 * than LOG_EVERY_S ago: then it is counted, and the next line of its kind
 * says how many were held back. keel's log escapes what clients sent. */
static void log_limited(keel_metrics_server *s, const char *kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void log_limited(keel_metrics_server *s, const char *kind, const char *fmt, ...) {
    log_kind *k = kind_of(s, kind);
    char text[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    double now = keel_now_s();
    if (k->last_s > 0 && now - k->last_s < LOG_EVERY_S) {
        k->held_back++;
        snprintf(k->newest, sizeof k->newest, "%s", text);
        return;
    }
    if (k->held_back)
        keel_log_warn("metrics: %s (and %ld more like it in the last %.0f s, not shown)", text, k->held_back,
                      now - k->last_s);
    else keel_log_warn("metrics: %s", text);
    k->last_s = now;
    k->held_back = 0;
}

/* The count of what was held back since each kind's last line. */
static void log_held_back(keel_metrics_server *s) {
    for (int i = 0; i < LOG_KINDS; i++)
        if (s->kinds[i].held_back)
            keel_log_warn("metrics: %ld more like \"%s\" were not shown", s->kinds[i].held_back, s->kinds[i].newest);
}

/* MHD_OPTION_EXTERNAL_LOGGER: a libmicrohttpd message is a keel warning
 * (its format string is its kind) rather than a raw line on stderr. */
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    char text[300];
    vsnprintf(text, sizeof text, fmt, ap);
    text[strcspn(text, "\n")] = 0; /* its lines end in one */
    log_limited(cls, fmt, "libmicrohttpd: %s", text);
}

/* ---- addresses and Host names ------------------------------------------------ */

static const unsigned char V4_MAPPED[12] = {[10] = 0xff, [11] = 0xff};

/* A socket address as 16 bytes, IPv4 mapped (::ffff:a.b.c.d) so that one key
 * serves both families; all zero for another family. */
static void address_key(const struct sockaddr *sa, unsigned char key[16]) {
    memset(key, 0, 16);
    if (sa && sa->sa_family == AF_INET6) {
        memcpy(key, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, 16);
    } else if (sa && sa->sa_family == AF_INET) {
        memcpy(key, V4_MAPPED, 12);
        memcpy(key + 12, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, 4);
    }
}

static bool is_loopback(const unsigned char key[16]) {
    static const unsigned char v6_loopback[16] = {[15] = 1};
    return !memcmp(key, v6_loopback, 16) || (!memcmp(key, V4_MAPPED, 12) && key[12] == 127);
}

static void format_address(const unsigned char key[16], char *out, size_t n) {
    if (!memcmp(key, V4_MAPPED, 12)) inet_ntop(AF_INET, key + 12, out, (socklen_t)n);
    else inet_ntop(AF_INET6, key, out, (socklen_t)n);
}

/* text[0..n) as an address key when it is an IP literal (IPv6 with or
 * without brackets). */
static bool parse_ip(const char *text, size_t n, unsigned char key[16]) {
    char buf[INET6_ADDRSTRLEN];
    if (n >= 2 && text[0] == '[' && text[n - 1] == ']') text++, n -= 2;
    if (n == 0 || n >= sizeof buf) return false;
    memcpy(buf, text, n);
    buf[n] = 0;
    memcpy(key, V4_MAPPED, 12);
    if (inet_pton(AF_INET, buf, key + 12) == 1) return true;
    return inet_pton(AF_INET6, buf, key) == 1;
}

/* A metrics.allowed_hosts entry: an IP address or a host name (letters,
 * digits, '-', '_', '.'), without a port or a scheme. */
static bool valid_host_entry(const char *h) {
    unsigned char ip[16];
    size_t n = strlen(h);
    if (parse_ip(h, n, ip)) return true;
    if (n == 0 || n > 253) return false;
    for (const char *p = h; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-' ||
              *p == '_' || *p == '.'))
            return false;
    return true;
}

/* Whether a Host header's host (its value less the port) names the same
 * host as an allowed entry: IP literals by address, names without regard to
 * case or a final dot. */
static bool same_host(const char *host, size_t n, const char *allowed) {
    unsigned char a[16], b[16];
    size_t m = strlen(allowed);
    bool host_ip = parse_ip(host, n, a), allowed_ip = parse_ip(allowed, m, b);
    if (host_ip || allowed_ip) return host_ip && allowed_ip && !memcmp(a, b, 16);
    if (n > 1 && host[n - 1] == '.') n--;
    if (m > 1 && allowed[m - 1] == '.') m--;
    return n == m && !strncasecmp(host, allowed, n);
}

/* Whether the dashboard and /api/run answer a request with this Host header:
 * one that names localhost, 127.0.0.1, [::1], the bind address or an entry of
 * metrics.allowed_hosts, on any port (an SSH tunnel moves the port). A page
 * of another site that a DNS name pointed at this machine (DNS rebinding)
 * sends its own name, and is refused. A request without Host is answered:
 * every browser sends one. */
static bool host_allowed(const keel_metrics_server *s, const char *value) {
    if (!value) return true;
    const char *end = value + strlen(value), *port;
    if (value[0] == '[') { /* [v6]:port */
        const char *close = strchr(value, ']');
        if (!close) return false;
        port = close + 1;
        end = close + 1;
    } else {
        port = strchr(value, ':');
        if (!port) port = end;
        else if (strchr(port + 1, ':')) return false; /* an IPv6 address needs its brackets */
        end = port;
    }
    if (*port && *port != ':') return false;
    for (const char *p = *port ? port + 1 : port; *p; p++)
        if (*p < '0' || *p > '9') return false;
    for (char **h = s->hosts; *h; h++)
        if (same_host(value, (size_t)(end - value), *h)) return true;
    return false;
}

/* ---- connections: deadlines and the share of one address ------------------- */

/* MHD_AcceptPolicyCallback: a remote address may hold SLOTS_PER_ADDRESS. */
static enum MHD_Result admit(void *cls, const struct sockaddr *addr, socklen_t addr_len) {
    (void)addr_len;
    keel_metrics_server *s = cls;
    unsigned char key[16];
    address_key(addr, key);
    if (is_loopback(key)) return MHD_YES;
    int held = 0;
    for (int i = 0; i < SLOTS; i++) held += s->conns[i].c && !memcmp(s->conns[i].addr, key, 16);
    if (held < SLOTS_PER_ADDRESS) return MHD_YES;
    char who[INET6_ADDRSTRLEN];
    format_address(key, who, sizeof who);
    log_limited(s, KIND_ADDRESS_FULL, "refused a connection from %s, which holds %d already (the most one address "
                "may)", who, held);
    return MHD_NO;
}

/* MHD_OPTION_NOTIFY_CONNECTION: an entry per open connection, its deadline
 * for the first request starting now. */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode what) {
    keel_metrics_server *s = cls;
    connection *e = *socket_context;
    if (what == MHD_CONNECTION_NOTIFY_CLOSED) {
        if (e) e->c = NULL;
        *socket_context = NULL;
        return;
    }
    for (int i = 0; i < SLOTS && !e; i++) /* libmicrohttpd admits at most SLOTS */
        if (!s->conns[i].c) e = &s->conns[i];
    if (!e) return;
    const union MHD_ConnectionInfo *fd = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD),
                                   *addr = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    *e = (connection){.c = c, .fd = fd ? fd->connect_fd : -1, .deadline_s = keel_now_s() + REQUEST_DEADLINE_S};
    address_key(addr ? addr->client_addr : NULL, e->addr);
    *socket_context = e;
}

static connection *entry_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *i = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return i ? i->socket_context : NULL;
}

/* MHD_OPTION_NOTIFY_COMPLETED: the answer is taken; the next request on the
 * connection (keep-alive) has REQUEST_DEADLINE_S from now. */
static void on_answered(void *cls, struct MHD_Connection *c, void **request, enum MHD_RequestTerminationCode why) {
    (void)cls, (void)request, (void)why;
    connection *e = entry_of(c);
    if (!e) return;
    e->answering = false;
    e->answered++;
    e->deadline_s = keel_now_s() + REQUEST_DEADLINE_S;
}

/* Shuts down each connection past its deadline — libmicrohttpd reads the end
 * of the stream and closes it; its descriptor stays open until then, so the
 * shutdown can never reach another file — and returns the seconds to the
 * next deadline (-1: none). A connection that never finished a request is
 * logged; one kept alive after its answers is closed quietly. */
static double cut_overdue(keel_metrics_server *s) {
    double now = keel_now_s(), next_s = -1;
    for (int i = 0; i < SLOTS; i++) {
        connection *e = &s->conns[i];
        if (!e->c || e->cut) continue;
        if (now < e->deadline_s) {
            if (next_s < 0 || e->deadline_s - now < next_s) next_s = e->deadline_s - now;
            continue;
        }
        if (e->fd >= 0) shutdown(e->fd, SHUT_RDWR);
        e->cut = true;
        char who[INET6_ADDRSTRLEN];
        format_address(e->addr, who, sizeof who);
        if (e->answering)
            log_limited(s, KIND_ANSWER_DEADLINE, "closed the connection of %s: its answer was not taken within %d s",
                        who, ANSWER_DEADLINE_S);
        else if (!e->answered)
            log_limited(s, KIND_REQUEST_DEADLINE, "closed a connection from %s that sent no whole request within %d s",
                        who, REQUEST_DEADLINE_S);
    }
    return next_s;
}

/* The serving thread: libmicrohttpd's epoll descriptor and the wake pipe,
 * polled until the next of its timeouts or of keel's deadlines. Signals go
 * to the process's other threads (the run's stop signals). */
static void *serve(void *arg) {
    keel_metrics_server *s = arg;
    keel_block_async_signals();
    struct pollfd ready[2] = {{.fd = s->epoll_fd, .events = POLLIN}, {.fd = s->wake[0], .events = POLLIN}};
    for (;;) {
        double next_s = cut_overdue(s);
        int wait_ms = next_s < 0 || next_s > 60 ? 60000 : (int)(next_s * 1000) + 1;
        MHD_UNSIGNED_LONG_LONG mhd_ms;
        if (MHD_get_timeout(s->daemon, &mhd_ms) == MHD_YES && mhd_ms < (MHD_UNSIGNED_LONG_LONG)wait_ms)
            wait_ms = (int)mhd_ms;
        if (poll(ready, 2, wait_ms) < 0 && errno != EINTR) {
            keel_log_warn("metrics: poll: %s (the endpoint stops serving)", strerror(errno));
            break;
        }
        if (ready[1].revents) break;
        MHD_run(s->daemon);
    }
    return NULL;
}

/* ---- requests ------------------------------------------------------------------ */

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
    connection *e = entry_of(c);
    if (e && !e->answering) e->answering = true, e->deadline_s = keel_now_s() + ANSWER_DEADLINE_S;
    if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD)) {
        *upload_size = 0; /* a body is not read: the answer is the same */
        return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain", "keel: only GET and HEAD\n", false);
    }
    /* /metrics answers any Host: Prometheus sends the name it scrapes by */
    if (!strcmp(url, "/metrics"))
        return reply(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", keel_exporter_render(s->exporter),
                     true);
    bool page = !strcmp(url, "/api/run") || !strcmp(url, "/");
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
    if (page && !host_allowed(s, host)) {
        log_limited(s, KIND_HOST, "refused %.100s for Host \"%.100s\" (421): the dashboard answers localhost, "
                    "127.0.0.1, [::1], metrics.bind and the names in metrics.allowed_hosts", url, host);
        return reply(c, MHD_HTTP_MISDIRECTED_REQUEST, "text/plain",
                     "keel: this Host is not one the dashboard answers to (localhost, 127.0.0.1, [::1], "
                     "metrics.bind, metrics.allowed_hosts)\n", false);
    }
    if (!strcmp(url, "/api/run"))
        return reply(c, MHD_HTTP_OK, "application/json", keel_exporter_json(s->exporter), true);
    if (!strcmp(url, "/"))
        return reply(c, MHD_HTTP_OK, "text/html; charset=utf-8", (char *)keel_dashboard_html, false);
    return reply(c, MHD_HTTP_NOT_FOUND, "text/plain", "keel: / (dashboard), /metrics (Prometheus), /api/run (JSON)\n",
                 false);
}

/* ---- the port ------------------------------------------------------------------ */

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

/* The Host names the dashboard answers to: localhost, 127.0.0.1, ::1, the
 * bind address unless it is a wildcard, and metrics.allowed_hosts, in
 * *hosts (NULL-terminated, free with free_hosts); an entry that is not a
 * host is an input error. */
static keel_status allowed_hosts(const keel_config *cfg, const char *bind_addr, char ***hosts) {
    size_t n = 0;
    for (char **h = cfg->metrics.allowed_hosts; h && *h; h++, n++)
        if (!valid_host_entry(*h)) {
            keel_errorf("metrics.allowed_hosts entry \"%s\" is not a host name or an IP address: give names such as "
                        "\"node12\" or \"10.0.0.7\", without a port or a scheme", *h);
            return KEEL_ERR_INPUT;
        }
    char **list = keel_xcalloc((n + 5) * sizeof *list, "metrics hosts");
    size_t k = 0;
    list[k++] = keel_xstrdup("localhost");
    list[k++] = keel_xstrdup("127.0.0.1");
    list[k++] = keel_xstrdup("::1");
    static const unsigned char any[16], v4_any[16] = {[10] = 0xff, [11] = 0xff};
    unsigned char ip[16];
    if (parse_ip(bind_addr, strlen(bind_addr), ip) && memcmp(ip, any, 16) && memcmp(ip, v4_any, 16))
        list[k++] = keel_xstrdup(bind_addr);
    for (char **h = cfg->metrics.allowed_hosts; h && *h; h++) list[k++] = keel_xstrdup(*h);
    *hosts = list;
    return KEEL_OK;
}

static void free_hosts(char **hosts) {
    for (char **h = hosts; h && *h; h++) keel_free(*h);
    keel_free(hosts);
}

/* The daemon on the listening socket fd, with keel's limits and logger, and
 * its serving thread; false (nothing left running) when either fails. */
static bool start_daemon(keel_metrics_server *s, int fd) {
    if (pipe2(s->wake, O_CLOEXEC) != 0) return false;
    s->daemon = MHD_start_daemon(MHD_USE_EPOLL | MHD_USE_ERROR_LOG, 0, admit, s, handle, s,
                                 MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s, MHD_OPTION_LISTEN_SOCKET, fd,
                                 MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)IDLE_TIMEOUT_S,
                                 MHD_OPTION_CONNECTION_LIMIT, (unsigned)SLOTS, MHD_OPTION_NOTIFY_CONNECTION,
                                 on_connection, s, MHD_OPTION_NOTIFY_COMPLETED, on_answered, s, MHD_OPTION_END);
    const union MHD_DaemonInfo *info = s->daemon ? MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_EPOLL_FD) : NULL;
    if (info) s->epoll_fd = info->epoll_fd;
    if (info && pthread_create(&s->thread, NULL, serve, s) == 0) return true;
    if (s->daemon) MHD_stop_daemon(s->daemon);
    else close(fd);
    s->daemon = NULL;
    close(s->wake[0]);
    close(s->wake[1]);
    return false;
}

keel_status keel_metrics_serve(const keel_config *cfg, const char *run_dir, keel_metrics_server **out) {
    *out = NULL;
    if (cfg->metrics.port == 0) return KEEL_OK;
    const char *bind_addr = cfg->metrics.bind ? cfg->metrics.bind : "127.0.0.1";
    char **hosts;
    keel_status st = allowed_hosts(cfg, bind_addr, &hosts);
    if (st != KEEL_OK) return st;
    int port, fd;
    st = open_port(cfg, bind_addr, &port, &fd);
    if (st != KEEL_OK || fd < 0) {
        free_hosts(hosts);
        return st;
    }
    keel_metrics_server *s = keel_xcalloc(sizeof *s, "metrics server");
    s->exporter = keel_exporter_new(run_dir);
    s->hosts = hosts;
    if (!start_daemon(s, fd)) {
        keel_errorf("metrics endpoint %s:%d: libmicrohttpd did not start", bind_addr, port);
        log_held_back(s);
        keel_exporter_free(s->exporter);
        free_hosts(s->hosts);
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
    while (write(s->wake[1], "x", 1) != 1 && errno == EINTR) {}
    pthread_join(s->thread, NULL);
    MHD_stop_daemon(s->daemon); /* closes the listening socket too */
    close(s->wake[0]);
    close(s->wake[1]);
    log_held_back(s);
    if (s->published) { /* nothing serves the run now */
        char path[4200];
        keel_run_path(path, sizeof path, s->run_dir, KEEL_RUN_ENDPOINT);
        unlink(path);
    }
    keel_exporter_free(s->exporter);
    free_hosts(s->hosts);
    keel_free(s->run_dir);
    keel_free(s);
}
