/* infer/serve.c: keel serve — the OpenAI completions API over HTTP
 * (libmicrohttpd) for one model (keel_serve_start in keel/infer.h).
 *
 * Two threads. The HTTP thread runs libmicrohttpd on its epoll descriptor:
 * it reads a request's body (at most MAX_BODY_BYTES), parses it
 * (infer_completion_parse: a malformed one is answered 400 at once), and
 * puts it in the queue — or answers 503 when `queue` requests wait already —
 * and suspends its connection. The worker takes the request at the head of
 * the queue and those behind it that decode alike, up to `batch` prompts,
 * runs them together (infer_completions_run), and resumes their connections
 * with the answers. Clients cannot hold the server: a request must arrive
 * whole within REQUEST_DEADLINE_S and an answer be taken within
 * ANSWER_DEADLINE_S (libmicrohttpd's own timeout restarts at every byte),
 * one remote address holds at most SLOTS_PER_ADDRESS connections, and a
 * server bound to loopback answers only requests addressed to loopback
 * names (DNS rebinding), as the metrics endpoint does (docs/security.md). */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "infer/completions.h"
#include "keel/infer.h"

enum {
    SLOTS = 64,                    /* connections at once */
    SLOTS_PER_ADDRESS = 16,        /* held by one remote address (loopback is exempt: every local client shares it) */
    MAX_BODY_BYTES = 4 << 20,      /* a request's body: 4 MiB holds 64 prompts of 8192 ids as JSON */
    REQUEST_DEADLINE_S = 30,       /* a whole request, from the connection or the previous answer: 4 MiB at 1 Mbit/s */
    ANSWER_DEADLINE_S = 60,        /* an answer taken by the client, once it is ready */
    IDLE_TIMEOUT_S = 60,           /* libmicrohttpd's: nothing moved either way (not while a request waits its turn) */
    STOP_DELIVER_S = 5,            /* keel_serve_stop waits this long for the last answers to be taken */
    LOG_EVERY_S = 10,              /* libmicrohttpd's lines: one at most this often */
};

/* A job: one request, from the queue to its answer. */
typedef struct job job;
struct job {
    completion_request req;
    struct MHD_Connection *c;
    unsigned status;               /* set by the worker with the answer, before the connection resumes */
    char *answer;
    job *next;
};

/* One HTTP request's state, from its first call to its completion. */
typedef struct {
    char *body;
    size_t len;
    bool too_big;
    job *job;                      /* once queued: it is answered when the worker resumes the connection */
} request;

typedef struct {
    struct MHD_Connection *c;      /* NULL: a free entry */
    int fd;
    unsigned char addr[16];        /* IPv4 as ::ffff:a.b.c.d */
    bool waiting;                  /* suspended while its request waits in the queue or runs: no deadline */
    bool answering;                /* an answer queued, not yet taken */
    bool cut;
    double deadline_s;
} connection;

/* The connections and the log limit are the HTTP thread's alone; the queue
 * is shared with the worker under mu. */
struct keel_server {
    keel_infer_model *m;
    keel_serve_options o;
    char *model_name;
    struct MHD_Daemon *daemon;
    pthread_t http, worker;
    bool http_started, worker_started;
    int epoll_fd;
    int wake[2];                   /* a byte wakes the HTTP thread: to stop, or after a resume */
    atomic_bool http_stop;
    bool loopback;                 /* bound to a loopback address: the Host check is on */
    char url[128];
    connection conns[SLOTS];
    double log_last_s;
    long log_held;
    pthread_mutex_t mu;
    pthread_cond_t more;
    job *head, *tail;
    int queued, running;
    bool stopping;
    atomic_int undelivered;        /* jobs queued whose request has not completed */
    uint64_t batches;              /* the worker's count, for answer ids */
    long long started_s;
};

/* ---- addresses ---------------------------------------------------------------- */

static const unsigned char V4_MAPPED[12] = {[10] = 0xff, [11] = 0xff};

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

/* Whether a Host header names this machine's loopback: localhost,
 * 127.x.x.x or [::1], any port. A page of another site that a DNS name
 * pointed here sends its own name; no Host at all is answered. */
static bool host_is_loopback(const char *value) {
    if (!value) return true;
    char host[256];
    size_t n = strlen(value);
    if (n == 0 || n >= sizeof host) return false;
    memcpy(host, value, n + 1);
    char *end = host[0] == '[' ? strchr(host, ']') : strchr(host, ':');
    if (host[0] == '[') {
        if (!end) return false;
        *end = 0;
        memmove(host, host + 1, strlen(host + 1) + 1);
    } else if (end) {
        *end = 0;
    }
    if (!strcasecmp(host, "localhost") || !strcasecmp(host, "localhost.")) return true;
    unsigned char key[16];
    memcpy(key, V4_MAPPED, 12);
    if (inet_pton(AF_INET, host, key + 12) == 1) return is_loopback(key);
    return inet_pton(AF_INET6, host, key) == 1 && is_loopback(key);
}

/* ---- libmicrohttpd's lines, and connections: deadlines, the share of one address ---- */

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    keel_server *s = cls;
    double now = keel_now_s();
    if (s->log_last_s > 0 && now - s->log_last_s < LOG_EVERY_S) {
        s->log_held++;
        return;
    }
    char text[300];
    vsnprintf(text, sizeof text, fmt, ap);
    text[strcspn(text, "\n")] = 0;
    if (s->log_held) keel_log_warn("serve: libmicrohttpd: %s (and %ld more lines not shown)", text, s->log_held);
    else keel_log_warn("serve: libmicrohttpd: %s", text);
    s->log_last_s = now, s->log_held = 0;
}

static enum MHD_Result admit(void *cls, const struct sockaddr *addr, socklen_t addr_len) {
    (void)addr_len;
    keel_server *s = cls;
    unsigned char key[16];
    address_key(addr, key);
    if (is_loopback(key)) return MHD_YES;
    int held = 0;
    for (int i = 0; i < SLOTS; i++) held += s->conns[i].c && !memcmp(s->conns[i].addr, key, 16);
    return held < SLOTS_PER_ADDRESS ? MHD_YES : MHD_NO;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode what) {
    keel_server *s = cls;
    connection *e = *socket_context;
    if (what == MHD_CONNECTION_NOTIFY_CLOSED) {
        if (e) e->c = NULL;
        *socket_context = NULL;
        return;
    }
    for (int i = 0; i < SLOTS && !e; i++)
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

static void job_free(job *j) {
    if (!j) return;
    infer_completion_free(&j->req);
    free(j->answer);
    keel_free(j);
}

/* MHD_OPTION_NOTIFY_COMPLETED: the answer is taken (or the connection gone);
 * the next request on the connection has REQUEST_DEADLINE_S from now. */
static void on_completed(void *cls, struct MHD_Connection *c, void **state, enum MHD_RequestTerminationCode why) {
    (void)why;
    keel_server *s = cls;
    request *r = *state;
    if (r) {
        if (r->job) atomic_fetch_sub(&s->undelivered, 1);
        job_free(r->job);
        keel_free(r->body);
        keel_free(r);
        *state = NULL;
    }
    connection *e = entry_of(c);
    if (e) e->answering = false, e->deadline_s = keel_now_s() + REQUEST_DEADLINE_S;
}

/* Shut down each connection past its deadline (libmicrohttpd then closes
 * it); the seconds to the next deadline, or -1. */
static double cut_overdue(keel_server *s) {
    double now = keel_now_s(), next_s = -1;
    for (int i = 0; i < SLOTS; i++) {
        connection *e = &s->conns[i];
        if (!e->c || e->cut || e->waiting) continue;
        if (now < e->deadline_s) {
            if (next_s < 0 || e->deadline_s - now < next_s) next_s = e->deadline_s - now;
            continue;
        }
        if (e->fd >= 0) shutdown(e->fd, SHUT_RDWR);
        e->cut = true;
    }
    return next_s;
}

static void *http_thread(void *arg) {
    keel_server *s = arg;
    struct pollfd ready[2] = {{.fd = s->epoll_fd, .events = POLLIN}, {.fd = s->wake[0], .events = POLLIN}};
    while (!atomic_load(&s->http_stop)) {
        double next_s = cut_overdue(s);
        int wait_ms = next_s < 0 || next_s > 60 ? 60000 : (int)(next_s * 1000) + 1;
        MHD_UNSIGNED_LONG_LONG mhd_ms;
        if (MHD_get_timeout(s->daemon, &mhd_ms) == MHD_YES && mhd_ms < (MHD_UNSIGNED_LONG_LONG)wait_ms)
            wait_ms = (int)mhd_ms;
        if (poll(ready, 2, wait_ms) < 0 && errno != EINTR) {
            keel_log_warn("serve: poll: %s (the server stops serving)", strerror(errno));
            break;
        }
        if (ready[1].revents) {
            char drain[64];
            while (read(s->wake[0], drain, sizeof drain) > 0) {}
        }
        MHD_run(s->daemon);
    }
    return NULL;
}

static void wake_http(keel_server *s) {
    while (write(s->wake[1], "x", 1) < 0 && errno == EINTR) {}
}

/* ---- answers ------------------------------------------------------------------ */

/* Queue body (owned: freed by libmicrohttpd) as the answer, JSON; allow: the
 * Allow header of a 405. */
static enum MHD_Result reply_allow(struct MHD_Connection *c, unsigned code, char *body, const char *allow) {
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    if (code == MHD_HTTP_SERVICE_UNAVAILABLE) MHD_add_response_header(r, "Retry-After", "1");
    if (allow) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
    connection *e = entry_of(c);
    if (e) e->answering = true, e->deadline_s = keel_now_s() + ANSWER_DEADLINE_S;
    enum MHD_Result ok = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result reply(struct MHD_Connection *c, unsigned code, char *body) {
    return reply_allow(c, code, body, NULL);
}

static enum MHD_Result reply_error(struct MHD_Connection *c, unsigned code, const char *type, const char *param,
                                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static enum MHD_Result reply_error(struct MHD_Connection *c, unsigned code, const char *type, const char *param,
                                   const char *fmt, ...) {
    char message[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    return reply(c, code, infer_completion_error(message, type, param));
}

static enum MHD_Result reply_models(keel_server *s, struct MHD_Connection *c) {
    cJSON *o = cJSON_CreateObject(), *data = cJSON_AddArrayToObject(o, "data"), *m = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON_AddStringToObject(m, "id", s->model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)s->started_s);
    cJSON_AddStringToObject(m, "owned_by", "keel");
    cJSON_AddNumberToObject(m, "max_model_len", s->m->cfg.model.max_seq_len);
    cJSON_AddItemToArray(data, m);
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return reply(c, MHD_HTTP_OK, text);
}

static enum MHD_Result reply_health(keel_server *s, struct MHD_Connection *c) {
    pthread_mutex_lock(&s->mu);
    int queued = s->queued, running = s->running;
    bool stopping = s->stopping;
    pthread_mutex_unlock(&s->mu);
    char *text = keel_xmalloc(256, "health"); /* libmicrohttpd frees it (keel_free is free) */
    snprintf(text, 256, "{\"status\":\"%s\",\"queued\":%d,\"running\":%d,\"queue\":%d,\"batch\":%d}",
             stopping ? "stopping" : "ok", queued, running, s->o.queue, s->o.batch);
    return reply(c, stopping ? MHD_HTTP_SERVICE_UNAVAILABLE : MHD_HTTP_OK, text);
}

/* ---- requests ------------------------------------------------------------------ */

/* A completions request's body is whole: parse it and queue it (the
 * connection waits, suspended), or answer 400, 413 or 503 now. */
static enum MHD_Result take_completion(keel_server *s, struct MHD_Connection *c, request *r) {
    if (r->too_big)
        return reply_error(c, MHD_HTTP_CONTENT_TOO_LARGE, "invalid_request_error", NULL,
                           "the request body is over %d bytes, keel serve's limit; send fewer or shorter prompts a "
                           "request", MAX_BODY_BYTES);
    job *j = keel_xcalloc(sizeof *j, "job");
    const char *param;
    keel_error_capture(true);
    keel_status st = infer_completion_parse(r->body ? r->body : "", r->len, &j->req, &param);
    keel_error_capture(false);
    if (st != KEEL_OK) {
        keel_free(j);
        return reply(c, MHD_HTTP_BAD_REQUEST, infer_completion_error(keel_last_error(), "invalid_request_error", param));
    }
    pthread_mutex_lock(&s->mu);
    bool full = s->queued >= s->o.queue, stopping = s->stopping;
    if (!full && !stopping) {
        j->c = c;
        if (s->tail) s->tail->next = j;
        else s->head = j;
        s->tail = j;
        s->queued++;
        atomic_fetch_add(&s->undelivered, 1);
        r->job = j;
        /* suspended before the worker can resume it: the lock orders the two */
        MHD_suspend_connection(c);
        pthread_cond_signal(&s->more);
    }
    pthread_mutex_unlock(&s->mu);
    if (stopping || full) {
        job_free(j);
        if (stopping) return reply_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, "server_busy", NULL, "keel serve is stopping");
        return reply_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, "server_busy", NULL,
                           "the queue is full (keel serve --queue %d: that many requests wait for the model "
                           "already); try again later, or start the server with a larger --queue", s->o.queue);
    }
    connection *e = entry_of(c);
    if (e) e->waiting = true;
    return MHD_YES;
}

/* The first call of a request (its headers are in): GETs are answered,
 * a POST of /v1/completions gets its state; the rest are refused. */
static enum MHD_Result first_call(keel_server *s, struct MHD_Connection *c, const char *url, const char *method,
                                  void **state) {
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
    if (s->loopback && !host_is_loopback(host))
        return reply_error(c, MHD_HTTP_MISDIRECTED_REQUEST, "invalid_request_error", NULL,
                           "keel serve is bound to loopback and answers requests addressed to localhost, 127.0.0.1 "
                           "or [::1] only");
    bool get = !strcmp(method, MHD_HTTP_METHOD_GET) || !strcmp(method, MHD_HTTP_METHOD_HEAD);
    bool post = !strcmp(method, MHD_HTTP_METHOD_POST);
    bool known = !strcmp(url, "/v1/completions") || !strcmp(url, "/v1/models") || !strcmp(url, "/health");
    if (!known)
        return reply_error(c, MHD_HTTP_NOT_FOUND, "invalid_request_error", NULL,
                           "keel serve has POST /v1/completions, GET /v1/models and GET /health");
    bool completions = !strcmp(url, "/v1/completions");
    if (completions ? !post : !get)
        return reply_allow(c, MHD_HTTP_METHOD_NOT_ALLOWED,
                           infer_completion_error(completions ? "/v1/completions takes POST only"
                                                              : "this path takes GET only",
                                                  "invalid_request_error", NULL),
                           completions ? "POST" : "GET, HEAD");
    if (!strcmp(url, "/v1/models")) return reply_models(s, c);
    if (!strcmp(url, "/health")) return reply_health(s, c);
    const char *length = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (length && strtoull(length, NULL, 10) > MAX_BODY_BYTES)
        return reply_error(c, MHD_HTTP_CONTENT_TOO_LARGE, "invalid_request_error", NULL,
                           "the request body is over %d bytes, keel serve's limit; send fewer or shorter prompts a "
                           "request", MAX_BODY_BYTES);
    *state = keel_xcalloc(sizeof(request), "request");
    return MHD_YES;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **state) {
    (void)version;
    keel_server *s = cls;
    request *r = *state;
    if (!r) return first_call(s, c, url, method, state);
    if (*upload_size) { /* a piece of the body: kept while it stays under the limit */
        if (!r->too_big && r->len + *upload_size <= MAX_BODY_BYTES) {
            r->body = keel_xrealloc(r->body, r->len + *upload_size + 1, "request body");
            memcpy(r->body + r->len, upload, *upload_size);
            r->len += *upload_size;
            r->body[r->len] = 0;
        } else {
            r->too_big = true;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (!r->job) return take_completion(s, c, r);
    connection *e = entry_of(c); /* resumed by the worker, the answer ready */
    if (e) e->waiting = false;
    char *answer = r->job->answer;
    r->job->answer = NULL;
    return answer ? reply(c, r->job->status, answer) : MHD_NO;
}

/* ---- the worker ------------------------------------------------------------------- */

/* Take the head of the queue and the requests behind it that decode alike,
 * up to o.batch prompts (the head always), into jobs; their count. */
static int take_batch(keel_server *s, job **jobs) {
    int n = 0, prompts = 0;
    job **link = &s->head, *prev = NULL;
    while (*link) {
        job *j = *link;
        bool take = n == 0 || (infer_completion_compatible(&jobs[0]->req, &j->req) &&
                               prompts + j->req.n_prompts <= s->o.batch);
        if (!take) {
            prev = j, link = &j->next;
            continue;
        }
        jobs[n++] = j, prompts += j->req.n_prompts;
        *link = j->next;
        if (s->tail == j) s->tail = prev;
        j->next = NULL;
        if (prompts >= s->o.batch) break;
    }
    s->queued -= n;
    return n;
}

/* Hand each job's connection back to the HTTP thread (a job is not touched after). */
static void resume_all(keel_server *s, job **jobs, int n) {
    for (int i = 0; i < n; i++) MHD_resume_connection(jobs[i]->c);
    wake_http(s);
}

static void *worker_thread(void *arg) {
    keel_server *s = arg;
    keel_error_capture(true); /* errors become answers, not lines on stderr */
    job **jobs = keel_xmalloc(sizeof(job *) * (size_t)(s->o.queue + 1), "batch");
    completion_request **reqs = keel_xmalloc(sizeof(completion_request *) * (size_t)(s->o.queue + 1), "batch");
    unsigned *status = keel_xmalloc(sizeof(unsigned) * (size_t)(s->o.queue + 1), "batch");
    char **answers = keel_xmalloc(sizeof(char *) * (size_t)(s->o.queue + 1), "batch");
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->head && !s->stopping) pthread_cond_wait(&s->more, &s->mu);
        if (s->stopping) { /* what still waits is answered 503 */
            int n = 0;
            for (job *j = s->head; j; j = j->next) jobs[n++] = j;
            s->head = s->tail = NULL, s->queued = 0;
            pthread_mutex_unlock(&s->mu);
            for (int i = 0; i < n; i++)
                jobs[i]->status = MHD_HTTP_SERVICE_UNAVAILABLE,
                jobs[i]->answer = infer_completion_error("keel serve is stopping", "server_busy", NULL);
            resume_all(s, jobs, n);
            break;
        }
        int n = take_batch(s, jobs);
        s->running = n;
        uint64_t batch_no = ++s->batches;
        pthread_mutex_unlock(&s->mu);
        for (int i = 0; i < n; i++) reqs[i] = &jobs[i]->req;
        char id[64];
        snprintf(id, sizeof id, "cmpl-%llx-%llx", (unsigned long long)s->started_s, (unsigned long long)batch_no);
        uint64_t seed = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull ^ batch_no << 20;
        infer_completions_run(s->m, reqs, n, &s->o, seed, id, status, answers);
        for (int i = 0; i < n; i++) jobs[i]->status = status[i], jobs[i]->answer = answers[i];
        pthread_mutex_lock(&s->mu);
        s->running = 0;
        pthread_mutex_unlock(&s->mu);
        resume_all(s, jobs, n);
    }
    keel_free(jobs), keel_free(reqs), keel_free(status), keel_free(answers);
    return NULL;
}

/* ---- start and stop ----------------------------------------------------------------- */

/* A listening socket on host:port (port 0: a free one), the port bound in *port. */
static keel_status listen_on(const char *host, int *port, int *fd, bool *loopback) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICHOST | AI_PASSIVE},
                    *ai;
    char service[16];
    snprintf(service, sizeof service, "%d", *port);
    int rc = getaddrinfo(host, service, &hints, &ai);
    if (rc != 0) {
        keel_errorf("--host \"%s\" is not a numeric IP address (%s): use e.g. 127.0.0.1 or 0.0.0.0", host,
                    gai_strerror(rc));
        return KEEL_ERR_INPUT;
    }
    unsigned char key[16];
    address_key(ai->ai_addr, key);
    *loopback = is_loopback(key);
    int sock = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1, e = 0;
    if (sock < 0) e = errno;
    else setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (!e && (bind(sock, ai->ai_addr, ai->ai_addrlen) != 0 || listen(sock, 64) != 0)) e = errno;
    freeaddrinfo(ai);
    struct sockaddr_storage bound;
    socklen_t len = sizeof bound;
    if (!e && getsockname(sock, (struct sockaddr *)&bound, &len) != 0) e = errno;
    if (e) {
        if (sock >= 0) close(sock);
        keel_errorf("keel serve %s:%d: cannot listen: %s%s", host, *port, strerror(e),
                    e == EADDRINUSE ? " (another server holds the port: pick another --port, or 0 for a free one)" : "");
        return KEEL_ERR_INPUT;
    }
    *port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                              : ((struct sockaddr_in *)&bound)->sin_port);
    *fd = sock;
    return KEEL_OK;
}

static bool start_daemon(keel_server *s, int fd) {
    if (pipe2(s->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        close(fd);
        return false;
    }
    s->daemon = MHD_start_daemon(MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG, 0, admit, s, handle,
                                 s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s, MHD_OPTION_LISTEN_SOCKET, fd,
                                 MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)IDLE_TIMEOUT_S,
                                 MHD_OPTION_CONNECTION_LIMIT, (unsigned)SLOTS, MHD_OPTION_NOTIFY_CONNECTION,
                                 on_connection, s, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_END);
    const union MHD_DaemonInfo *info = s->daemon ? MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_EPOLL_FD) : NULL;
    if (info) s->epoll_fd = info->epoll_fd;
    if (info && pthread_create(&s->http, NULL, http_thread, s) == 0) return s->http_started = true;
    if (s->daemon) MHD_stop_daemon(s->daemon);
    else close(fd);
    s->daemon = NULL;
    return false;
}

keel_status keel_serve_start(keel_infer_model *m, const keel_serve_options *o, keel_server **out) {
    *out = NULL;
    if (!m->tok) {
        keel_errorf("keel serve needs the model's tokenizer (answers are text) and %s has none (none carried or "
                    "configured); pass --tokenizer FILE", m->what);
        return KEEL_ERR_INPUT;
    }
    if (o->batch < 1 || o->queue < 1) {
        keel_errorf("keel serve: --batch %d and --queue %d must be 1 or more", o->batch, o->queue);
        return KEEL_ERR_INPUT;
    }
    const char *host = o->host ? o->host : "127.0.0.1";
    int port = o->port, fd;
    bool loopback;
    keel_status st = listen_on(host, &port, &fd, &loopback);
    if (st != KEEL_OK) return st;
    keel_server *s = keel_xcalloc(sizeof *s, "server");
    s->m = m, s->o = *o, s->loopback = loopback, s->wake[0] = s->wake[1] = -1;
    s->model_name = keel_xstrdup(o->model_name ? o->model_name : "keel");
    s->o.model_name = s->model_name;
    s->started_s = (long long)time(NULL);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->more, NULL);
    bool v6 = strchr(host, ':') != NULL;
    snprintf(s->url, sizeof s->url, "http://%s%s%s:%d/v1", v6 ? "[" : "", host, v6 ? "]" : "", port);
    if (!start_daemon(s, fd)) {
        keel_errorf("keel serve %s:%d: libmicrohttpd did not start", host, port);
        keel_serve_stop(s);
        return KEEL_ERR_IO;
    }
    if (pthread_create(&s->worker, NULL, worker_thread, s) != 0) {
        keel_errorf("keel serve: cannot start the worker thread: %s", strerror(errno));
        keel_serve_stop(s);
        return KEEL_ERR_IO;
    }
    s->worker_started = true;
    *out = s;
    return KEEL_OK;
}

const char *keel_serve_url(const keel_server *s) { return s ? s->url : NULL; }

void keel_serve_stop(keel_server *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    pthread_cond_broadcast(&s->more);
    pthread_mutex_unlock(&s->mu);
    if (s->worker_started) pthread_join(s->worker, NULL);
    /* every job is answered now; the HTTP thread delivers what it can */
    for (double t0 = keel_now_s(); atomic_load(&s->undelivered) > 0 && keel_now_s() - t0 < STOP_DELIVER_S;)
        usleep(10000);
    if (s->http_started) {
        atomic_store(&s->http_stop, true);
        wake_http(s);
        pthread_join(s->http, NULL);
    }
    if (s->daemon) MHD_stop_daemon(s->daemon); /* closes the listening socket and every connection */
    for (int i = 0; i < 2; i++)
        if (s->wake[i] >= 0) close(s->wake[i]);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->more);
    keel_free(s->model_name);
    keel_free(s);
}
