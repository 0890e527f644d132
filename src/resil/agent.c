/* resil/agent.c: `keel agent` — the torchrun of keel, one per pod or host.
 * Agents that started on their own meet in etcd (keel/etcd.h), agree on who
 * takes part in a round, and each starts its node's share of the world's
 * ranks (spawn.c), which find each other through the same etcd (the Gloo
 * store, comm/gloo.c). When a rank fails, a node is lost or a node comes,
 * the agents form the next round on whoever is there and the ranks resume
 * from the in-memory snapshots that survived, else the newest checkpoint,
 * resharded to the new world size (train/resume.c). docs/kubernetes.md,
 * "keel agent", says the protocol; the keys, under /keel/<run id>/:
 *
 *   round                 "K F": the round now, and the failures so far
 *   state                 "done" once a round ended with every rank done;
 *                         "stopped: <reason>" once the policy stopped the job
 *   policy                the failure history the supervisor's policy keeps
 *                         (keel_policy_history as JSON), written by node 0
 *   waiting/<node>        a node that came while a round ran (its lease)
 *   rounds/K/join/<node>  a node in round K: its lease is its heartbeat
 *   rounds/K/members      who is in round K, in node-rank order (whoever
 *                         closes the round writes it, create-if-absent)
 *   rounds/K/outcome      how round K failed, from the agent that saw it:
 *                         {"end", "rank", "cause"} (the first word stands)
 *   rounds/K/rollback     round K rolls back a divergence: every node drops
 *                         its in-memory snapshots
 *   rounds/K/ready        the run directory is prepared: "ok", or "stop N
 *                         <reason>" (every agent exits N with the reason)
 *   rounds/K/gloo/...     the ranks' Gloo addresses */
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "keel/ckpt.h"
#include "keel/etcd.h"
#include "keel/monitor.h"
#include "keel/resil.h"
#include "keel/run.h"

#define LEASE_TTL_S 10      /* a node silent this long is lost */
#define POLL_S 0.2
#define RANK_GRACE_S 5.0    /* ranks asked to stop have this long before SIGKILL */
#define WATCH_RETRY_S 1.0   /* while ranks run, an etcd that does not answer is asked again later */

static volatile sig_atomic_t g_stop;
static void on_stop(int sig) { g_stop = sig; }

typedef struct {
    const keel_agent_options *o;
    const keel_config *cfg;
    const char *run_dir;
    char self[4096];
    keel_etcd *etcd;        /* the rendezvous: retries for o->rdzv_timeout_s */
    keel_etcd *watch;       /* while ranks run: retries briefly, a missed poll is no failure */
    char prefix[300];       /* /keel/<run id>/ */
    /* the lease, kept alive by its own thread */
    int64_t lease;
    pthread_t keeper;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop_keeper, lease_lost;
    /* the round this node is in */
    int64_t round, failures;
    char **members;
    int n_members, node_rank;
    char **previous;        /* the last round's members, in node-rank order */
    int n_previous;
    double slowest_gap_s;   /* node 0: the longest gap between two beats of a training rank seen so far */
} agent;

static void key(const agent *a, char *out, size_t n, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void key(const agent *a, char *out, size_t n, const char *fmt, ...) {
    int used = snprintf(out, n, "%s", a->prefix);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out + used, n - (size_t)used, fmt, ap);
    va_end(ap);
}

/* ---- the lease ---------------------------------------------------------------------- */

static void *keep_lease(void *arg) {
    agent *a = arg;
    keel_etcd *e;
    if (keel_etcd_open(a->o->endpoint, WATCH_RETRY_S, &e) != KEEL_OK) return NULL;
    pthread_mutex_lock(&a->mu);
    while (!a->stop_keeper) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += LEASE_TTL_S / 3;
        pthread_cond_timedwait(&a->cv, &a->mu, &until);
        if (a->stop_keeper) break;
        int64_t lease = a->lease;
        pthread_mutex_unlock(&a->mu);
        bool alive = true;
        keel_error_capture(true); /* an etcd restarting: the next try says more */
        keel_status st = keel_etcd_lease_keepalive(e, lease, &alive);
        keel_error_capture(false);
        pthread_mutex_lock(&a->mu);
        if (st == KEEL_OK && !alive && lease == a->lease) a->lease_lost = true;
    }
    pthread_mutex_unlock(&a->mu);
    keel_etcd_close(e);
    return NULL;
}

static bool lease_lost(agent *a) {
    pthread_mutex_lock(&a->mu);
    bool lost = a->lease_lost;
    pthread_mutex_unlock(&a->mu);
    return lost;
}

/* A new lease (the old one expired: etcd was away longer than its TTL). */
static keel_status renew_lease(agent *a) {
    int64_t lease;
    keel_status st = keel_etcd_lease_grant(a->etcd, LEASE_TTL_S, &lease);
    if (st != KEEL_OK) return st;
    pthread_mutex_lock(&a->mu);
    a->lease = lease, a->lease_lost = false;
    pthread_mutex_unlock(&a->mu);
    return KEEL_OK;
}

/* ---- the round ---------------------------------------------------------------------- */

static bool parse_round(const char *v, int64_t *round, int64_t *failures) {
    char tail;
    return sscanf(v, "%" SCNd64 " %" SCNd64 "%c", round, failures, &tail) == 2 && *round >= 0 && *failures >= 0;
}

/* The round now (made "0 0" when this job has none yet). */
static keel_status read_round(agent *a, keel_etcd *e, int64_t *round, int64_t *failures) {
    char k[400];
    key(a, k, sizeof k, "round");
    bool created;
    keel_status st = keel_etcd_create(e, k, "0 0", 3, 0, &created);
    keel_etcd_kv kv;
    bool found = false;
    if (st == KEEL_OK) st = keel_etcd_get(e, k, &kv, &found);
    if (st != KEEL_OK) return st;
    bool ok = found && parse_round(kv.value, round, failures);
    if (found) keel_etcd_kv_free(&kv);
    if (ok) return KEEL_OK;
    keel_errorf("etcd key %s holds no round (\"K F\"): another program wrote there; give keel agent a run id of "
                "its own (--rdzv-id, PET_RDZV_ID)", k);
    return KEEL_ERR_INPUT;
}

/* Move from round K to K+1 (with one more failure when `failure`); whoever
 * moved it first wins, and a round already moved stays as it is. */
static void next_round(agent *a, keel_etcd *e, bool failure) {
    char k[400], was[64], now[64];
    key(a, k, sizeof k, "round");
    snprintf(was, sizeof was, "%" PRId64 " %" PRId64, a->round, a->failures);
    snprintf(now, sizeof now, "%" PRId64 " %" PRId64, a->round + 1, a->failures + (failure ? 1 : 0));
    bool swapped;
    keel_etcd_swap(e, k, was, now, &swapped);
}

static void free_members(agent *a) {
    for (int i = 0; i < a->n_members; i++) keel_free(a->members[i]);
    keel_free(a->members);
    a->members = NULL, a->n_members = 0;
}

/* After a round: its members are the next round's order. */
static void remember_members(agent *a) {
    for (int i = 0; i < a->n_previous; i++) keel_free(a->previous[i]);
    keel_free(a->previous);
    a->previous = a->members, a->n_previous = a->n_members;
    a->members = NULL, a->n_members = 0;
}

/* rounds/K/members: a JSON list of node names. */
static bool parse_members(agent *a, const char *text) {
    cJSON *list = cJSON_Parse(text);
    int n = cJSON_IsArray(list) ? cJSON_GetArraySize(list) : 0;
    bool ok = n > 0;
    a->members = keel_xcalloc(sizeof(char *) * (size_t)(n + 1), "members");
    const cJSON *m;
    cJSON_ArrayForEach(m, list) {
        if (!cJSON_IsString(m)) ok = false;
        else a->members[a->n_members++] = keel_xstrdup(m->valuestring);
    }
    cJSON_Delete(list);
    if (!ok) free_members(a);
    return ok;
}

typedef enum { JOINED, LATE, MOVED, FAILED } join_result;

/* The order a joined node takes: its node rank in the last round it was in
 * (the previous round's members, read once per round), else after them all,
 * by when it joined. */
static int64_t previous_place(agent *a, const char *node, int64_t joined_revision) {
    for (int i = 0; i < a->n_previous; i++)
        if (!strcmp(a->previous[i], node)) return i;
    return (int64_t)1 << 40 | joined_revision;
}

/* Join round K: wait until it closes — max nodes joined, or min nodes and
 * the last call over — and read who is in it. */
static join_result join_round(agent *a) {
    char k[400], members_key[400];
    key(a, k, sizeof k, "rounds/%" PRId64 "/join/%s", a->round, a->o->node);
    key(a, members_key, sizeof members_key, "rounds/%" PRId64 "/members", a->round);
    if (keel_etcd_put(a->etcd, k, a->o->node, strlen(a->o->node), a->lease) != KEEL_OK) return FAILED;
    char join_prefix[400];
    key(a, join_prefix, sizeof join_prefix, "rounds/%" PRId64 "/join/", a->round);
    double quorum_at = 0; /* when min nodes had joined (0: not yet) */
    for (;;) {
        if (g_stop) return FAILED;
        keel_etcd_kv kv;
        bool found;
        if (keel_etcd_get(a->etcd, members_key, &kv, &found) != KEEL_OK) return FAILED;
        if (found) {
            bool ok = parse_members(a, kv.value);
            keel_etcd_kv_free(&kv);
            if (!ok) {
                keel_errorf("etcd key %s is not a list of nodes: another program wrote there; give keel agent a "
                            "run id of its own", members_key);
                return FAILED;
            }
            a->node_rank = -1;
            for (int i = 0; i < a->n_members; i++)
                if (!strcmp(a->members[i], a->o->node)) a->node_rank = i;
            if (a->node_rank >= 0) return JOINED;
            free_members(a);
            return LATE;
        }
        int64_t round, failures;
        if (read_round(a, a->etcd, &round, &failures) != KEEL_OK) return FAILED;
        if (round != a->round) return MOVED;
        keel_etcd_kv *joined;
        int n;
        if (keel_etcd_list(a->etcd, join_prefix, &joined, &n) != KEEL_OK) return FAILED;
        if (n >= a->o->min_nodes && quorum_at == 0) quorum_at = keel_now_s();
        if (n < a->o->min_nodes) quorum_at = 0;
        if (n >= a->o->max_nodes || (quorum_at > 0 && keel_now_s() - quorum_at >= a->o->last_call_s)) {
            /* close it: the first max_nodes in order — the last round's nodes in their
             * places (their ranks' snapshots are on them), then the others as they joined */
            int64_t *place = keel_xmalloc(sizeof(int64_t) * (size_t)(n + 1), "join order");
            for (int i = 0; i < n; i++) place[i] = previous_place(a, joined[i].value, joined[i].create_revision);
            for (int i = 1; i < n; i++)
                for (int j = i; j > 0 && place[j] < place[j - 1]; j--) {
                    keel_etcd_kv t = joined[j];
                    joined[j] = joined[j - 1], joined[j - 1] = t;
                    int64_t p = place[j];
                    place[j] = place[j - 1], place[j - 1] = p;
                }
            keel_free(place);
            cJSON *list = cJSON_CreateArray();
            for (int i = 0; i < n && i < a->o->max_nodes; i++) cJSON_AddItemToArray(list, cJSON_CreateString(joined[i].value));
            char *text = cJSON_PrintUnformatted(list);
            bool created;
            keel_etcd_create(a->etcd, members_key, text, strlen(text), 0, &created);
            cJSON_free(text);
            cJSON_Delete(list);
        }
        keel_etcd_kvs_free(joined, n);
        keel_sleep_s(POLL_S);
    }
}

/* state: "done", "stopped: <reason>", or empty while the job runs. */
static keel_status job_state(agent *a, char *state, size_t n) {
    char k[400];
    key(a, k, sizeof k, "state");
    keel_etcd_kv kv;
    bool found;
    keel_status st = keel_etcd_get(a->etcd, k, &kv, &found);
    state[0] = 0;
    if (st == KEEL_OK && found) snprintf(state, n, "%s", kv.value), keel_etcd_kv_free(&kv);
    return st;
}

/* A node that came while a round ran: announce it and wait for the next. */
static keel_status wait_as_latecomer(agent *a) {
    char k[400];
    key(a, k, sizeof k, "waiting/%s", a->o->node);
    keel_log_info("agent: round %" PRId64 " started without this node (%s): waiting for the next", a->round,
                  a->o->node);
    keel_status st = keel_etcd_put(a->etcd, k, a->o->node, strlen(a->o->node), a->lease);
    while (st == KEEL_OK && !g_stop) { /* until the next round, or the job's end */
        int64_t round, failures;
        char state[8];
        st = read_round(a, a->etcd, &round, &failures);
        if (st == KEEL_OK && round != a->round) break;
        if (st == KEEL_OK && (st = job_state(a, state, sizeof state)) == KEEL_OK && state[0]) break;
        keel_sleep_s(POLL_S);
    }
    keel_etcd_delete_prefix(a->etcd, k, NULL);
    return g_stop ? KEEL_ERR_STOPPED : st;
}

/* ---- the supervisor's policy, across rounds ----------------------------------------------
 * The agent that sees a round fail records how (rounds/K/outcome); node 0 of
 * the next round puts it to keel_policy_decide with the history kept in etcd,
 * as the supervisor does after a failed launch: roll back a divergence, skip
 * its data window the second time, stop after a crash loop or max_restarts,
 * back off while failures make no progress. */

static void record_outcome(agent *a, keel_end end, int rank, const char *cause) {
    char k[400];
    key(a, k, sizeof k, "rounds/%" PRId64 "/outcome", a->round);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "end", keel_end_name(end));
    cJSON_AddNumberToObject(o, "rank", rank);
    cJSON_AddStringToObject(o, "cause", cause);
    char *text = cJSON_PrintUnformatted(o);
    bool created;
    keel_etcd_create(a->etcd, k, text, strlen(text), 0, &created);
    cJSON_free(text);
    cJSON_Delete(o);
}

/* A JSON value from etcd (NULL: none, or etcd did not answer). */
static cJSON *get_json(agent *a, const char *k) {
    keel_etcd_kv kv;
    bool found;
    if (keel_etcd_get(a->etcd, k, &kv, &found) != KEEL_OK || !found) return NULL;
    cJSON *j = cJSON_Parse(kv.value);
    keel_etcd_kv_free(&kv);
    return j;
}

static int64_t json_int(const cJSON *o, const char *name, int64_t fallback) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsNumber(v) ? (int64_t)v->valuedouble : fallback;
}

/* How the last round failed, as the policy sees it: what its agents recorded
 * (a rank that only lost its peer records nothing: without a word from the
 * node that failed, a crash), and the steps rank 0 had done. */
static void last_outcome(agent *a, keel_outcome *o, char *cause, size_t cause_n) {
    char k[400];
    key(a, k, sizeof k, "rounds/%" PRId64 "/outcome", a->round - 1);
    cJSON *j = get_json(a, k);
    const cJSON *end = cJSON_GetObjectItemCaseSensitive(j, "end"), *said = cJSON_GetObjectItemCaseSensitive(j, "cause");
    o->kind = KEEL_END_CRASHED;
    for (int e = 0; cJSON_IsString(end) && e <= KEEL_END_UNHEALTHY; e++)
        if (!strcmp(end->valuestring, keel_end_name((keel_end)e))) o->kind = (keel_end)e;
    snprintf(cause, cause_n, "%s", cJSON_IsString(said) ? said->valuestring : "a rank lost its peer");
    o->cause = cause;
    cJSON_Delete(j);
    keel_heartbeat_info hb;
    o->done = keel_heartbeat_read(a->run_dir, 0, &hb) ? hb.step : 0;
    keel_outcome_run_state(o, a->cfg, a->run_dir);
}

static void history_read(agent *a, keel_policy_history *h) {
    char k[400];
    key(a, k, sizeof k, "policy");
    keel_policy_history_init(h);
    cJSON *j = get_json(a, k);
    h->restarts = (int)json_int(j, "restarts", 0);
    h->fail_step = json_int(j, "fail_step", -1);
    h->fail_streak = (int)json_int(j, "fail_streak", 0);
    h->diverged_step = json_int(j, "diverged_step", -1);
    h->skipped_step = json_int(j, "skipped_step", 0);
    cJSON_Delete(j);
}

static void history_write(agent *a, const keel_policy_history *h) {
    char k[400], text[256];
    key(a, k, sizeof k, "policy");
    snprintf(text, sizeof text,
             "{\"restarts\": %d, \"fail_step\": %" PRId64 ", \"fail_streak\": %d, \"diverged_step\": %" PRId64
             ", \"skipped_step\": %" PRId64 "}",
             h->restarts, h->fail_step, h->fail_streak, h->diverged_step, h->skipped_step);
    keel_etcd_put(a->etcd, k, text, strlen(text), 0);
}

/* Node 0, in a round that follows a failed one: the policy's word. A
 * relaunch is carried out here (the skipped window into RUN/supervisor.json,
 * the rollback key, the backoff); false: the job stops, *code and why say
 * how. */
static bool decide(agent *a, int *code, char *why, size_t why_n) {
    keel_resilience_config rc = a->cfg->resilience;
    if (a->o->max_restarts >= 0) rc.max_restarts = a->o->max_restarts; /* PET_MAX_RESTARTS, --max-restarts */
    keel_outcome o = {0};
    char cause[800];
    last_outcome(a, &o, cause, sizeof cause);
    keel_policy_history before, after;
    history_read(a, &before);
    keel_action act = keel_policy_decide(&rc, &before, &o, &after);
    if (act.event) keel_event(a->run_dir, act.event, o.done + 1, "%s", act.reason);
    if (act.kind != KEEL_ACT_RELAUNCH) {
        *code = act.exit_code;
        snprintf(why, why_n, "%s", act.reason);
        return false;
    }
    if (act.skip_step > 0) {
        keel_run_state state;
        keel_status st = keel_run_state_read(a->run_dir, &state);
        if (st == KEEL_OK) {
            keel_run_state_skip(&state, act.skip_step);
            st = keel_run_state_write(a->run_dir, &state);
            keel_run_state_free(&state);
        }
        if (st != KEEL_OK)
            keel_log_warn("%s/%s not updated: step %" PRId64 "'s data window will not be skipped", a->run_dir,
                          KEEL_RUN_SUPERVISOR, act.skip_step);
    }
    if (o.kind == KEEL_END_DIVERGED) { /* the snapshots hold the steps that led to it: back to a checkpoint */
        char k[400];
        key(a, k, sizeof k, "rounds/%" PRId64 "/rollback", a->round);
        keel_etcd_put(a->etcd, k, "1", 1, 0);
    }
    history_write(a, &after);
    if (act.backoff_s > 0) {
        keel_log_info("agent: backing off %.1f s before round %" PRId64 " (failures without progress)", act.backoff_s,
                      a->round);
        for (double until = keel_now_s() + act.backoff_s; keel_now_s() < until && !g_stop;) keel_sleep_s(POLL_S);
    }
    return true;
}

/* Every node of a round that rolls back drops its snapshots before its ranks start. */
static void maybe_roll_back(agent *a) {
    char k[400];
    key(a, k, sizeof k, "rounds/%" PRId64 "/rollback", a->round);
    keel_etcd_kv kv;
    bool found;
    if (keel_etcd_get(a->etcd, k, &kv, &found) != KEEL_OK || !found) return;
    keel_etcd_kv_free(&kv);
    int n = keel_snap_remove_run(a->run_dir);
    if (n > 0) keel_log_info("agent: round %" PRId64 " rolls back a divergence: removed %d in-memory snapshot(s)",
                             a->round, n);
}

/* ---- the run directory ----------------------------------------------------------------- */

/* Node 0: whether this round follows a failed one (more failures than the
 * round before it). Each round's count is kept beside it to compare. */
static bool follows_failure(agent *a) {
    char k[400], text[32];
    key(a, k, sizeof k, "rounds/%" PRId64 "/failures", a->round);
    snprintf(text, sizeof text, "%" PRId64, a->failures);
    keel_etcd_put(a->etcd, k, text, strlen(text), 0);
    if (a->round == 0) return false;
    key(a, k, sizeof k, "rounds/%" PRId64 "/failures", a->round - 1);
    keel_etcd_kv kv;
    bool found;
    if (keel_etcd_get(a->etcd, k, &kv, &found) != KEEL_OK || !found) return false;
    int64_t before = atoll(kv.value);
    keel_etcd_kv_free(&kv);
    return a->failures > before;
}

/* Node 0 prepares the run directory for this round's world (a new run, or
 * the one to resume, resharded when the world changed) after the policy's
 * word on a failed round, and says so in rounds/K/ready; the others wait for
 * it. KEEL_ERR_INPUT: the job stops, every agent with exit *code. */
static keel_status prepare_run(agent *a, int world, bool *restart, int *code) {
    char k[400];
    key(a, k, sizeof k, "rounds/%" PRId64 "/ready", a->round);
    *restart = false;
    if (a->node_rank == 0) {
        char said[1100];
        *restart = follows_failure(a);
        if (*restart && !decide(a, code, said, sizeof said)) {
            char state[400];
            key(a, state, sizeof state, "state");
            char text[1200];
            snprintf(text, sizeof text, "stopped: %s", said);
            keel_etcd_put(a->etcd, state, text, strlen(text), 0);
            keel_errorf("%s", said);
        } else {
            keel_config cfg = *a->cfg;
            keel_status st = keel_run_prepare_nodes(&cfg, a->run_dir, world, a->o->nproc, a->round > 0);
            *code = st == KEEL_OK ? 0 : 2;
            snprintf(said, sizeof said, "%s", st == KEEL_OK ? "" : keel_last_error()); /* the line it printed */
            if (st == KEEL_OK) keel_heartbeat_clear(a->run_dir, a->o->max_nodes * a->o->nproc); /* a larger world's too */
        }
        char ready[1200] = "ok";
        if (*code) snprintf(ready, sizeof ready, "stop %d %s", *code, said);
        keel_etcd_put(a->etcd, k, ready, strlen(ready), 0);
        return *code ? KEEL_ERR_INPUT : KEEL_OK;
    }
    for (;;) {
        keel_etcd_kv kv;
        bool found;
        if (keel_etcd_get(a->etcd, k, &kv, &found) != KEEL_OK) return KEEL_ERR_IO;
        if (found) {
            int used = 0;
            *code = 0;
            if (strcmp(kv.value, "ok") && (sscanf(kv.value, "stop %d %n", code, &used) != 1 || !used || !*code))
                *code = 1, used = 0;
            if (*code) keel_errorf("node 0 (%s) stopped the job: %s", a->members[0], kv.value + used);
            keel_etcd_kv_free(&kv);
            return *code ? KEEL_ERR_INPUT : KEEL_OK;
        }
        int64_t round, failures;
        if (read_round(a, a->etcd, &round, &failures) != KEEL_OK || round != a->round) return KEEL_ERR_IO;
        if (g_stop) return KEEL_ERR_STOPPED;
        keel_sleep_s(POLL_S);
    }
}

/* ---- one round's ranks -------------------------------------------------------------- */

typedef enum { RAN_DONE, RAN_FAILED, RAN_MOVED, RAN_NODE_LOST, RAN_NODE_CAME, RAN_HUNG, RAN_STOPPED } run_end;

/* Whether a member's join key is gone (its lease expired: the node is lost),
 * or a node waits to join; a poll that etcd did not answer says nothing. */
static run_end look_around(agent *a, char *who, size_t who_n) {
    char join_prefix[400], waiting[400];
    key(a, join_prefix, sizeof join_prefix, "rounds/%" PRId64 "/join/", a->round);
    key(a, waiting, sizeof waiting, "waiting/");
    keel_error_capture(true);
    int64_t round, failures;
    run_end end = RAN_DONE; /* nothing seen */
    keel_etcd_kv *kvs;
    int n;
    if (read_round(a, a->watch, &round, &failures) == KEEL_OK && round != a->round) end = RAN_MOVED;
    if (end == RAN_DONE && keel_etcd_list(a->watch, join_prefix, &kvs, &n) == KEEL_OK) {
        for (int m = 0; m < a->n_members && end == RAN_DONE; m++) {
            bool there = false;
            for (int i = 0; i < n && !there; i++) there = !strcmp(kvs[i].value, a->members[m]);
            if (!there) end = RAN_NODE_LOST, snprintf(who, who_n, "%s", a->members[m]);
        }
        keel_etcd_kvs_free(kvs, n);
    }
    if (end == RAN_DONE && a->n_members < a->o->max_nodes && keel_etcd_list(a->watch, waiting, &kvs, &n) == KEEL_OK) {
        if (n > 0) end = RAN_NODE_CAME, snprintf(who, who_n, "%s", kvs[0].value);
        keel_etcd_kvs_free(kvs, n);
    }
    keel_error_capture(false);
    return end;
}

static run_end run_ranks(agent *a, int world, int *exit_code, int *failed_rank, char *who, size_t who_n) {
    char store[400], gloo_prefix[400];
    snprintf(store, sizeof store, "etcd://%s", keel_etcd_endpoint(a->etcd));
    key(a, gloo_prefix, sizeof gloo_prefix, "rounds/%" PRId64 "/gloo", a->round);
    char *argv[] = {a->self, "worker", (char *)a->run_dir, NULL};
    keel_ranks_spec spec = {.n = a->o->nproc, .first_rank = a->node_rank * a->o->nproc, .world_size = world,
                            .store = store, .prefix = gloo_prefix, .host = a->o->host[0] ? a->o->host : NULL,
                            .argv = argv};
    keel_ranks *ranks;
    *exit_code = 0, *failed_rank = -1;
    if (keel_ranks_start(&spec, &ranks) != KEEL_OK) return RAN_FAILED;
    run_end end = RAN_DONE;
    double next_look = keel_now_s() + 1;
    bool stopping = false;
    /* node 0 holds every rank to the supervisor's hang rules (the heartbeats are in the shared run directory) */
    keel_watch w;
    char here[64] = "";
    gethostname(here, sizeof here - 1);
    keel_straggler_watch slow;
    double *compute_s = NULL;
    if (a->node_rank == 0) {
        keel_watch_init(&w, &a->cfg->resilience, world, keel_unix_s(), a->slowest_gap_s);
        keel_straggler_init(&slow, world, a->cfg->resilience.straggler_factor, a->cfg->resilience.straggler_steps);
        compute_s = keel_xcalloc(sizeof(double) * (size_t)world, "compute times");
    }
    for (;;) {
        if (keel_ranks_poll(ranks, exit_code)) {
            if (stopping) end = RAN_STOPPED;
            else if (*exit_code != 0) end = RAN_FAILED, *failed_rank = keel_ranks_failed(ranks);
            break;
        }
        if (keel_ranks_failed(ranks) >= 0 && end == RAN_DONE && !stopping) {
            end = RAN_FAILED, *failed_rank = keel_ranks_failed(ranks);
            break;
        }
        if (g_stop && !stopping) { /* a stop for the pod: the ranks save and end (exit 75) */
            keel_ranks_signal(ranks, g_stop);
            stopping = true;
        }
        if (!stopping && keel_now_s() >= next_look) {
            end = look_around(a, who, who_n);
            if (end == RAN_DONE && lease_lost(a)) end = RAN_NODE_LOST, snprintf(who, who_n, "%s", a->o->node);
            keel_watch_finding f;
            if (end == RAN_DONE && a->node_rank == 0) {
                keel_watch_read(&w, a->run_dir);
                double ratio; /* a straggler is an event: Kubernetes, not keel, places pods (no drain) */
                keel_straggler_report(&slow, &w, a->run_dir, "", compute_s, &ratio);
                if (keel_watch_hung(&w, keel_unix_s(), false, here, &f))
                    end = RAN_HUNG, *failed_rank = f.rank, snprintf(who, who_n, "%.700s", f.cause);
            }
            if (end != RAN_DONE) break;
            next_look = keel_now_s() + 1;
        }
        keel_sleep_s(0.02);
    }
    if (a->node_rank == 0) {
        a->slowest_gap_s = w.slowest_gap_s;
        keel_watch_free(&w);
        keel_straggler_free(&slow);
        keel_free(compute_s);
    }
    if (end != RAN_DONE && end != RAN_STOPPED) {
        /* the others' ranks lost theirs too, or soon will: ask, then make sure */
        keel_ranks_signal(ranks, SIGTERM);
        double until = keel_now_s() + RANK_GRACE_S;
        int ignored;
        while (!keel_ranks_poll(ranks, &ignored) && keel_now_s() < until) keel_sleep_s(0.02);
    }
    keel_ranks_free(ranks);
    return end;
}

/* ---- the agent ------------------------------------------------------------------------ */

static keel_status rounds(agent *a, int *exit_code) {
    int64_t checked = 0; /* the failures this node's health was checked after */
    for (;;) {
        if (g_stop) return *exit_code = KEEL_EXIT_RESUME, KEEL_OK;
        if (lease_lost(a) && renew_lease(a) != KEEL_OK) return KEEL_ERR_IO;
        char state[1200];
        keel_status st = job_state(a, state, sizeof state);
        if (st != KEEL_OK) return st;
        if (state[0]) { /* a latecomer's job ended without it */
            if (!strcmp(state, "done")) keel_log_info("agent: the job finished without this node (%s)", a->o->node);
            else keel_errorf("agent: the job was %s", state);
            return *exit_code = !strcmp(state, "done") ? 0 : 1, KEEL_OK;
        }
        st = read_round(a, a->etcd, &a->round, &a->failures);
        if (st != KEEL_OK) return st;
        if (a->failures > checked) { /* after a failure, as the supervisor does: this node's own checks */
            checked = a->failures;
            char failed[32];
            if (!keel_health_here(a->cfg, a->run_dir, a->o->node, a->o->nproc, failed, sizeof failed)) {
                keel_errorf("agent: this node (%s) failed the %s health check after a failure: it leaves the job, "
                            "which goes on without it if --nnodes allows (events: %s/events.jsonl)", a->o->node,
                            failed, a->run_dir);
                return *exit_code = 1, KEEL_OK;
            }
        }
        join_result j = join_round(a);
        if (j == FAILED) return g_stop ? (*exit_code = KEEL_EXIT_RESUME, KEEL_OK) : KEEL_ERR_IO;
        if (j == MOVED) continue;
        if (j == LATE) {
            st = wait_as_latecomer(a);
            if (st == KEEL_ERR_STOPPED) return *exit_code = KEEL_EXIT_RESUME, KEEL_OK;
            if (st != KEEL_OK) return st;
            continue;
        }
        int world = a->n_members * a->o->nproc;
        keel_log_info("agent: round %" PRId64 ": node %d of %d (%s), ranks %d-%d of %d", a->round, a->node_rank,
                      a->n_members, a->o->node, a->node_rank * a->o->nproc, (a->node_rank + 1) * a->o->nproc - 1,
                      world);
        bool restart;
        int code;
        st = prepare_run(a, world, &restart, &code);
        if (st == KEEL_ERR_INPUT) return free_members(a), *exit_code = code, KEEL_OK;
        if (st == KEEL_ERR_STOPPED) return free_members(a), *exit_code = KEEL_EXIT_RESUME, KEEL_OK;
        if (st != KEEL_OK) { /* the round moved on meanwhile */
            free_members(a);
            continue;
        }
        if (a->node_rank == 0) {
            keel_event(a->run_dir, "rendezvous", -1, "round %" PRId64 ": %d node(s) x %d rank(s) = world %d: %s",
                       a->round, a->n_members, a->o->nproc, world, a->members[0]);
            if (restart)
                keel_event(a->run_dir, "restart", -1, "restart %" PRId64 ": round %" PRId64 " on %d node(s)",
                           a->failures, a->round, a->n_members);
        }
        maybe_roll_back(a);
        int failed_rank;
        char who[800] = "";
        run_end end = run_ranks(a, world, &code, &failed_rank, who, sizeof who);
        remember_members(a);
        switch (end) {
        case RAN_DONE: {
            char k[400];
            key(a, k, sizeof k, "state");
            keel_etcd_put(a->etcd, k, "done", 4, 0);
            return *exit_code = 0, KEEL_OK;
        }
        case RAN_STOPPED: return *exit_code = code ? code : KEEL_EXIT_RESUME, KEEL_OK;
        case RAN_FAILED:
            if (code == 2) { /* a rank refused its input: every relaunch would too */
                keel_errorf("agent: rank %d rejected its input (exit 2); see %s/logs/", failed_rank, a->run_dir);
                return *exit_code = 2, KEEL_OK;
            }
            if (code == KEEL_EXIT_PEER_LOST) /* the failure is another node's: its agent, or its lost lease, names it */
                keel_event(a->run_dir, "peer_lost", -1, "rank %d on %s lost a peer in round %" PRId64 "; the agents "
                           "form round %" PRId64, failed_rank, a->o->node, a->round, a->round + 1);
            else {
                keel_end kind = code == KEEL_EXIT_DIVERGED ? KEEL_END_DIVERGED : KEEL_END_CRASHED;
                snprintf(who, sizeof who, "rank %d on %s exited with code %d in round %" PRId64, failed_rank,
                         a->o->node, code, a->round);
                keel_event_with(a->run_dir, "failure", -1,
                                &(keel_event_fields){.cause = keel_end_name(kind), .has_rank = true,
                                                     .rank = failed_rank, .node = a->o->node},
                                "%s: %s; the agents form round %" PRId64, keel_end_name(kind), who, a->round + 1);
                record_outcome(a, kind, failed_rank, who);
            }
            next_round(a, a->etcd, true); /* a round that failed is one failure, whoever moves it on */
            break;
        case RAN_NODE_LOST:
            keel_event_with(a->run_dir, "failure", -1, &(keel_event_fields){.cause = "node_lost", .node = who},
                            "node %s was lost in round %" PRId64 " (its lease expired); the agents form round %"
                            PRId64 " on the nodes left", who, a->round, a->round + 1);
        {
            char lost[900];
            snprintf(lost, sizeof lost, "node %s was lost (its lease expired)", who);
            record_outcome(a, KEEL_END_CRASHED, -1, lost);
        }
            next_round(a, a->etcd, true);
            break;
        case RAN_HUNG:
            keel_event_with(a->run_dir, "failure", -1,
                            &(keel_event_fields){.cause = "hang", .has_rank = true, .rank = failed_rank},
                            "hang: %s; the agents form round %" PRId64, who, a->round + 1);
            keel_log_warn("agent: %s; ending round %" PRId64, who, a->round);
            record_outcome(a, KEEL_END_HUNG, failed_rank, who);
            next_round(a, a->etcd, true);
            break;
        case RAN_NODE_CAME:
            keel_event(a->run_dir, "node_joined", -1, "node %s is waiting to join; round %" PRId64 " ends for "
                       "round %" PRId64 " to take it in", who, a->round, a->round + 1);
            next_round(a, a->etcd, false);
            break;
        case RAN_MOVED: break;
        }
    }
}

keel_status keel_agent_reset(const keel_agent_options *o) {
    keel_etcd *e;
    keel_status st = keel_etcd_open(o->endpoint, o->rdzv_timeout_s, &e);
    if (st != KEEL_OK) return st;
    char prefix[300];
    snprintf(prefix, sizeof prefix, "/keel/%s/", o->run_id);
    int64_t deleted = 0;
    st = keel_etcd_delete_prefix(e, prefix, &deleted);
    if (st == KEEL_OK)
        printf("keel agent --reset: removed %" PRId64 " key(s) of run id %s from etcd at %s (%s*)\n", deleted,
               o->run_id, keel_etcd_endpoint(e), prefix);
    keel_etcd_close(e);
    return st;
}

keel_status keel_agent_run(const keel_config *cfg, const char *run_dir, const keel_agent_options *o, int *exit_code) {
    *exit_code = 1;
    agent a = {.o = o, .cfg = cfg, .run_dir = run_dir};
    snprintf(a.prefix, sizeof a.prefix, "/keel/%s/", o->run_id);
    keel_status st = keel_self_path(a.self, sizeof a.self);
    if (st == KEEL_OK) st = keel_etcd_open(o->endpoint, o->rdzv_timeout_s, &a.etcd);
    if (st == KEEL_OK) st = keel_etcd_open(o->endpoint, WATCH_RETRY_S, &a.watch);
    char state[1200];
    if (st == KEEL_OK && (st = job_state(&a, state, sizeof state)) == KEEL_ERR_IO)
        st = KEEL_ERR_INPUT; /* no etcd where the job says: the endpoint given is wrong (exit 2) */
    if (st == KEEL_OK && !strcmp(state, "done")) {
        keel_errorf("run id %s already finished (etcd at %s says so): give this job a new run id (--rdzv-id, "
                    "PET_RDZV_ID), or clear the old one with keel agent --reset", o->run_id, o->endpoint);
        st = KEEL_ERR_INPUT;
    } else if (st == KEEL_OK && !strncmp(state, "stopped: ", 9)) {
        keel_errorf("run id %s was stopped (%s): fix that, then give the job a new run id (--rdzv-id, PET_RDZV_ID) "
                    "or clear this one with keel agent --reset", o->run_id, state + 9);
        st = KEEL_ERR_INPUT;
    }
    if (st == KEEL_OK) st = keel_etcd_lease_grant(a.etcd, LEASE_TTL_S, &a.lease);
    if (st != KEEL_OK) {
        keel_etcd_close(a.watch);
        keel_etcd_close(a.etcd);
        return st;
    }
    pthread_mutex_init(&a.mu, NULL);
    pthread_cond_init(&a.cv, NULL);
    pthread_create(&a.keeper, NULL, keep_lease, &a);
    int sigs[] = {SIGTERM, SIGINT, SIGUSR1};
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) signal(sigs[i], on_stop);
    keel_log_info("agent %s: %d-%d node(s) x %d rank(s), rendezvous at etcd %s, run id %s", o->node, o->min_nodes,
                  o->max_nodes, o->nproc, o->endpoint, o->run_id);
    st = rounds(&a, exit_code);
    /* this node's part of the job is over (done, stopped, or it left): its ranks' snapshots go, as a
     * supervisor's do when its run ends; a later run resumes from the checkpoints */
    int removed = keel_snap_remove_run(run_dir);
    if (removed > 0) keel_log_info("agent: removed %d in-memory snapshot segment(s) of this node", removed);
    pthread_mutex_lock(&a.mu);
    a.stop_keeper = true;
    pthread_cond_signal(&a.cv);
    pthread_mutex_unlock(&a.mu);
    pthread_join(a.keeper, NULL);
    /* a node that leaves says so at once: the others need not wait for its lease to expire */
    keel_error_capture(true);
    keel_etcd_lease_revoke(a.watch, a.lease);
    keel_error_capture(false);
    pthread_cond_destroy(&a.cv);
    pthread_mutex_destroy(&a.mu);
    free_members(&a);
    remember_members(&a); /* frees the previous ones */
    keel_etcd_close(a.watch);
    keel_etcd_close(a.etcd);
    return st;
}
