/* train/snapshots.c: in-memory snapshots (resilience.snapshot_every_steps,
 * ranks under the supervisor) — the fast layer under the disk checkpoints.
 *
 * After every N steps each rank packs its arrays (parameters, AdamW m and v;
 * replicas too, in the layout of its checkpoint file) into the older slot of
 * its shared-memory segment (ckpt/segment.c) on a thread of its own, and
 * commits it with its step and checksum. The copy overlaps the next forward
 * and backward as a save's does; that step's update waits for the copy (on
 * the host, copied and hashed in one pass; a device's copy is hashed during
 * the update). Nothing else is needed to resume: the data position and
 * the learning rate follow from the step, and no RNG state is kept.
 *
 * Buddies: when the ranks span several nodes, each rank also keeps a replica
 * of one rank of another node — rank r's buddy is the rank with r's place on
 * the next node — in its own node's shared memory. The snapshot of step k
 * goes to the buddy in one point-to-point exchange issued (like a collective:
 * every rank at once, a ring over the nodes) as step k+1's update begins,
 * when the copy is complete; it runs on the comm thread during the update,
 * and the buddy commits it at the next boundary. A node lost with its memory
 * then resumes from its ranks' replicas, one step older than the snapshots.
 *
 * Resume: the ranks all-gather the steps each holds, of its own and of the
 * replica it keeps, and take the newest step that every rank can get — from
 * its own segment, else from its buddy — when it is at least as new as the
 * newest checkpoint; every copy is verified against its checksum, and a
 * failure anywhere moves every rank to the next older step, then to disk. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "keel/ckpt.h"
#include "keel/fsdp.h"
#include "keel/run.h"
#include "keel/train.h"
#include "train/snapshots.h"
#include "train/stop.h"

struct trainer_snap {
    int every;
    int64_t floats;                /* the packed shard: parameters, m, v */
    keel_snap *own, *replica;      /* this rank's segment; the replica it keeps of rank `from` */
    const keel_backend *be;        /* whose memory the state is: own is pinned for it */
    int to, from;                  /* the buddy this rank's snapshots go to / come from (-1: none) */
    int *holder;                   /* (world) which rank keeps each rank's replica (-1: none) */
    int *shard_of;                 /* (world) each rank's shard rank */
    uint64_t key;                  /* what the state must match: keel_run_state_key */
    /* the snapshot in flight */
    int step;
    float *dst;                    /* its slot */
    keel_snap_piece *pieces;       /* host memory: room for the live state as the slot's pieces */
    int slot;
    pthread_t thread;
    bool live;
    atomic_bool copied;
    bool send_due;                 /* copied into dst, not yet sent to the buddy */
    /* the replica exchange in flight */
    keel_comm_req *req;
    int rep_slot, rep_step;
    double stall_s;
};

/* The node of each rank: the hash of its host name, or with
 * $KEEL_SIMULATED_NODES=N (tests, rehearsals) N equal blocks of ranks. */
static void node_ids(trainer *t, uint64_t *node) {
    const char *sim = getenv("KEEL_SIMULATED_NODES");
    int n = sim ? atoi(sim) : 0;
    if (n > 0 && t->world_size % n == 0) {
        for (int r = 0; r < t->world_size; r++) node[r] = (uint64_t)(r / (t->world_size / n));
        return;
    }
    char name[256];
    keel_node_name(name, sizeof name);
    uint64_t h = XXH3_64bits(name, strlen(name));
    double mine[2] = {(double)(h >> 32), (double)(h & 0xffffffffu)};
    double *all = keel_xmalloc(sizeof(double) * 2 * (size_t)t->world_size, "node ids");
    keel_comm_allgather(t->world, mine, all, 2, KEEL_COMM_F64);
    for (int r = 0; r < t->world_size; r++) node[r] = ((uint64_t)all[2 * r] << 32) | (uint64_t)all[2 * r + 1];
    keel_free(all);
}

/* Each rank's buddy: the rank with its place (among its node's ranks, in
 * rank order) on the next node, in order of the nodes' first ranks; none on
 * one node. Every rank computes the same table. */
static void pick_buddies(trainer *t, trainer_snap *s) {
    int W = t->world_size;
    uint64_t *node = keel_xmalloc(sizeof(uint64_t) * (size_t)W, "nodes");
    int *first = keel_xmalloc(sizeof(int) * (size_t)W, "nodes"), *to = keel_xmalloc(sizeof(int) * (size_t)W, "buddies");
    node_ids(t, node);
    int n_nodes = 0;
    for (int r = 0; r < W; r++) { /* first[k]: node k's first rank */
        bool seen = false;
        for (int k = 0; k < n_nodes && !seen; k++) seen = node[first[k]] == node[r];
        if (!seen) first[n_nodes++] = r;
    }
    s->holder = keel_xmalloc(sizeof(int) * (size_t)W, "buddies");
    for (int r = 0; r < W; r++) to[r] = s->holder[r] = -1;
    for (int r = 0; r < W && n_nodes > 1; r++) {
        int k = 0, place = 0;
        while (node[first[k]] != node[r]) k++;
        for (int q = 0; q < r; q++) place += node[q] == node[r];
        uint64_t next = node[first[(k + 1) % n_nodes]];
        int size = 0;
        for (int q = 0; q < W; q++) size += node[q] == next;
        for (int q = 0, i = 0; q < W; q++)
            if (node[q] == next && i++ == place % size) to[r] = q;
    }
    for (int r = 0; r < W; r++) /* one replica per holder: the first rank that picked it */
        if (to[r] >= 0 && s->holder[r] < 0) {
            bool taken = false;
            for (int q = 0; q < r; q++) taken |= to[q] == to[r] && s->holder[q] == to[r];
            if (!taken) s->holder[r] = to[r];
        }
    s->to = s->holder[t->rank];
    s->from = -1;
    for (int r = 0; r < W; r++)
        if (s->holder[r] == t->rank) s->from = r;
    keel_free(node);
    keel_free(first);
    keel_free(to);
}

static void close_all(trainer_snap *s, bool remove) {
    if (s->own) {
        void *base;
        size_t bytes;
        keel_snap_mapping(s->own, &base, &bytes);
        s->be->unpin(base);
    }
    keel_snap_close(s->own, remove);
    keel_snap_close(s->replica, remove);
    s->own = s->replica = NULL;
}

void trainer_snap_init(trainer *t) {
    trainer_snap *s = keel_xcalloc(sizeof *s, "snapshots");
    t->snap = s;
    s->be = t->be;
    s->to = s->from = -1;
    s->every = t->world ? t->cfg->resilience.snapshot_every_steps : 0;
    if (s->every <= 0) return;
    s->floats = trainer_packed_floats(&t->packed);
    if (s->be->host_memory)
        s->pieces = keel_xmalloc(sizeof(keel_snap_piece) * KEEL_CKPT_ARRAYS * (size_t)t->packed.n_ranges, "snapshot pieces");
    pick_buddies(t, s);
    const keel_fsdp_plan *plan = keel_fsdp_get_plan(t->fsdp);
    double mine = keel_fsdp_shard_rank(t->fsdp), *all = keel_xmalloc(sizeof(double) * (size_t)t->world_size, "shards");
    keel_comm_allgather(t->world, &mine, all, 1, KEEL_COMM_F64);
    s->shard_of = keel_xmalloc(sizeof(int) * (size_t)t->world_size, "shards");
    for (int r = 0; r < t->world_size; r++) s->shard_of[r] = (int)all[r];
    keel_free(all);
    /* keyed by the run's model, data and global batch: another one resumes from disk */
    s->key = keel_run_state_key(t->cfg, trainer_global_batch(t));
    keel_snap_shape own = {t->rank, t->world_size, plan->shard_ranks, s->shard_of[t->rank], s->floats};
    keel_error_capture(true);
    keel_status st = keel_snap_open(t->run_dir, &own, s->key, false, &s->own);
    if (st == KEEL_OK) { /* a device copies the state into it beside the next step */
        void *base;
        size_t bytes;
        keel_snap_mapping(s->own, &base, &bytes);
        s->be->pin(base, bytes, "in-memory snapshot segment");
    }
    if (st == KEEL_OK && s->from >= 0) {
        keel_snap_shape rep = {s->from, t->world_size, plan->shard_ranks, s->shard_of[s->from], s->floats};
        st = keel_snap_open(t->run_dir, &rep, s->key, true, &s->replica);
    }
    keel_error_capture(false);
    if (st != KEEL_OK) {
        keel_log_warn("in-memory snapshots off: %s", keel_last_error());
        keel_event(t->run_dir, "snapshot_failed", -1, "rank %d: %s", t->rank, keel_last_error());
    }
    /* every rank snapshots, or none: the buddies' exchanges are collective */
    double failed = st != KEEL_OK;
    keel_comm_allreduce_scalar(t->world, &failed, KEEL_COMM_MAX);
    if (failed != 0) {
        close_all(s, true);
        s->every = 0;
    }
}

static void join(trainer_snap *s) {
    if (s->live) pthread_join(s->thread, NULL);
    s->live = false;
}

/* The replica exchange issued at the last update: done, committed. */
static void finish_exchange(trainer_snap *s) {
    if (!s->req) return;
    keel_comm_wait(s->req);
    s->req = NULL;
    if (s->replica) keel_snap_commit(s->replica, s->rep_slot, s->rep_step);
}

void trainer_snap_free(trainer *t, bool completed) {
    trainer_snap *s = t->snap;
    if (!s) return;
    join(s);
    finish_exchange(s);
    close_all(s, completed); /* a run that completed has no use for them */
    keel_free(s->pieces);
    keel_free(s->holder);
    keel_free(s->shard_of);
    keel_free(s);
    t->snap = NULL;
}

int64_t trainer_snap_bytes(const trainer *t) {
    const trainer_snap *s = t->snap;
    return (int64_t)sizeof(float) * 2 * s->floats * ((s->own != NULL) + (s->replica != NULL));
}

double trainer_snap_take_stall(trainer *t) {
    double x = t->snap->stall_s;
    t->snap->stall_s = 0;
    return x;
}

/* The state into the segment's free slot. On the host the thread copies and
 * hashes it in one pass (keel_snap_fill); on a device the copies are issued
 * (by the caller: a backend is used from one thread), and the thread waits
 * for them and hashes the copy while the update changes the arrays. */
static void *snapshot_thread(void *arg) {
    trainer *t = arg;
    trainer_snap *s = t->snap;
    if (s->be->host_memory) {
        s->dst = keel_snap_begin(s->own, s->step, &s->slot);
        keel_snap_fill(s->own, s->slot, s->step, s->pieces, trainer_packed_pieces(&t->packed, s->pieces));
        atomic_store(&s->copied, true);
        return NULL;
    }
    s->be->copies_wait();
    atomic_store(&s->copied, true); /* the arrays may change; the checksum reads the copy */
    keel_snap_commit(s->own, s->slot, s->step);
    return NULL;
}

void trainer_snap_before_update(trainer *t) {
    trainer_snap *s = t->snap;
    if (!s->live) return;
    if (!atomic_load(&s->copied)) {
        keel_heartbeat_progress(t->heartbeat, "snapshot"); /* a copy in memory: the fast hang limit holds */
        double t0 = keel_now_s();
        while (!atomic_load(&s->copied)) {
            struct timespec ts = {0, 200000}; /* 0.2 ms */
            nanosleep(&ts, NULL);
        }
        s->stall_s += keel_now_s() - t0;
    }
    if (!s->send_due) return;
    /* to the buddy, from the rank whose replica this one keeps: on the comm thread, during the update */
    s->send_due = false;
    s->rep_step = s->step;
    float *into = s->replica ? keel_snap_begin(s->replica, s->rep_step, &s->rep_slot) : NULL;
    keel_comm_isendrecv(t->world, s->dst, s->to, into, s->from, (size_t)s->floats, KEEL_COMM_F32, &s->req);
}

void trainer_snap_boundary(trainer *t, int steps_done, bool last_or_stop) {
    trainer_snap *s = t->snap;
    double t0 = keel_now_s();
    trainer_stop_deadline(true); /* the exchange with the buddy waits on a peer */
    finish_exchange(s);
    if (s->every > 0 && !last_or_stop && steps_done % s->every == 0) {
        join(s); /* the last one's checksum */
        s->step = steps_done;
        s->send_due = s->to >= 0 || s->from >= 0;
        atomic_store(&s->copied, false);
        /* A device's copies are issued here and run beside the next step;
         * host memory is copied on the thread, also overlapping it. */
        if (!s->be->host_memory) {
            s->dst = keel_snap_begin(s->own, s->step, &s->slot);
            trainer_packed_copy_out(&t->packed, s->dst, true);
        }
        KEEL_CHECK(pthread_create(&s->thread, NULL, snapshot_thread, t) == 0, "snapshot thread");
        s->live = true;
    }
    s->stall_s += keel_now_s() - t0;
}

/* ---- resume --------------------------------------------------------------------- */

/* What every rank holds: its own steps (2) and its replica's (2), -1 for none. */
enum { HELD = 4 };

static bool holds(const double *held, int r, int from, int64_t step) {
    return held[HELD * r + from] == (double)step || held[HELD * r + from + 1] == (double)step;
}

/* The newest step below `below`, at least `floor`, that every rank can get
 * from its own segment or its buddy's replica (0: none). */
static int64_t newest_reachable(const trainer *t, const double *held, int64_t floor, int64_t below) {
    const trainer_snap *s = t->snap;
    int64_t best = 0;
    for (int i = 0; i < HELD * t->world_size; i++) {
        int64_t step = (int64_t)held[i];
        bool ok = step > 0 && step >= floor && step < below && step > best;
        for (int r = 0; r < t->world_size && ok; r++)
            ok = holds(held, r, 0, step) || (s->holder[r] >= 0 && holds(held, s->holder[r], 2, step));
        if (ok) best = step;
    }
    return best;
}

/* Verify this rank's copy of `step` in segment x (NULL: none); an event names a damaged one. */
static const float *verified(trainer *t, keel_snap *x, int64_t step) {
    int64_t have[2];
    int n = x ? keel_snap_steps(x, have) : 0;
    if (!(n > 0 && have[0] == step) && !(n > 1 && have[1] == step)) return NULL;
    const float *data;
    keel_error_capture(true);
    keel_status st = keel_snap_get(x, step, &data);
    keel_error_capture(false);
    if (st == KEEL_OK) return data;
    keel_log_warn("%s", keel_last_error());
    keel_event(t->run_dir, "snapshot_damaged", step, "rank %d: %s", t->rank, keel_last_error());
    return NULL;
}

/* Load `step` on every rank, from its own segment or its buddy's replica.
 * false: some rank could not (a copy failed its checksum). Collective. */
static bool load(trainer *t, int64_t step, int *from_buddies) {
    trainer_snap *s = t->snap;
    int W = t->world_size;
    const float *own = verified(t, s->own, step), *rep = s->from >= 0 ? verified(t, s->replica, step) : NULL;
    if (own) trainer_packed_copy_in(&t->packed, own);
    double mine[2] = {own != NULL, rep != NULL}, *ok = keel_xmalloc(sizeof(double) * 2 * (size_t)W, "snapshot");
    keel_comm_allgather(t->world, mine, ok, 2, KEEL_COMM_F64);
    bool all = true;
    *from_buddies = 0;
    for (int r = 0; r < W; r++) {
        bool buddy = ok[2 * r] == 0 && s->holder[r] >= 0 && ok[2 * s->holder[r] + 1] != 0;
        all &= ok[2 * r] != 0 || buddy;
        *from_buddies += buddy;
    }
    if (all && *from_buddies > 0) { /* the replicas go home, into their ranks' own segments */
        bool send = s->from >= 0 && ok[2 * s->from] == 0, get = !own;
        int slot = 0;
        float *into = get ? keel_snap_begin(s->own, step, &slot) : NULL;
        keel_comm_sendrecv(t->world, send ? rep : NULL, send ? s->from : -1, into, get ? s->holder[t->rank] : -1,
                           (size_t)s->floats, KEEL_COMM_F32);
        if (get) {
            keel_snap_commit(s->own, slot, step);
            trainer_packed_copy_in(&t->packed, into);
        }
    }
    keel_free(ok);
    return all;
}

/* ---- resume at another world size ---------------------------------------------
 *
 * A relaunch on another number of ranks (a shrink after a node is lost, a
 * larger allocation) finds the last world's segments in its nodes' shared
 * memory under their own names (-w<world size>-), in the layout of that
 * world's checkpoint files. The ranks agree on the newest step every old
 * shard can be had at, each old shard served by the first rank whose node
 * holds it (its own segment or a buddy's replica) and verified there; then,
 * in W rounds of one exchange (a ring: round d, rank r serves rank r+d), every
 * rank gathers the canonical ranges it now owns into its own new segment,
 * commits it and loads it — as a disk checkpoint is resharded. */

typedef struct {
    const keel_fsdp_plan *old, *plan; /* the last world's layout, this one's */
    const int *server;                /* (old shard ranks) which rank serves each old shard */
} reshard_map;

/* Each piece rank q (shard rank `shard`) needs, in order: fn(ctx, old shard,
 * where in it, where in q's packed shard, floats). */
static void each_piece(const reshard_map *m, int shard, void (*fn)(void *, int, int64_t, int64_t, int64_t),
                       void *ctx) {
    keel_param_range *ranges;
    int n = keel_fsdp_param_ranges(m->plan, shard, &ranges);
    for (int a = 0; a < KEEL_CKPT_ARRAYS; a++)
        for (int i = 0; i < n; i++) {
            int64_t p = ranges[i].begin, len = ranges[i].len, dst = a * m->plan->shard_total + ranges[i].buffer_offset;
            int u = 0;
            while (len > 0) {
                while (p >= m->old->units[u].offset + m->old->units[u].logical) u++;
                const keel_fsdp_unit *x = &m->old->units[u];
                int64_t pos = p - x->offset, within = pos % x->shard, k = x->shard - within;
                k = k < len ? k : len;
                fn(ctx, (int)(pos / x->shard), a * m->old->shard_total + x->shard_offset + within, dst, k);
                p += k, dst += k, len -= k;
            }
        }
    keel_free(ranges);
}

typedef struct {
    const reshard_map *m;
    int server;                /* pieces served by this rank only */
    int64_t count;             /* floats */
    float *buf;                /* pack from src[], or unpack into dst (NULL: count only) */
    const float *const *src;   /* (old shard ranks) the verified data this rank serves */
    float *dst;
    bool unpack;
} piece_walk;

static void walk_piece(void *ctx, int shard, int64_t from, int64_t to, int64_t n) {
    piece_walk *w = ctx;
    if (w->m->server[shard] != w->server) return;
    if (w->buf && !w->unpack) memcpy(w->buf + w->count, w->src[shard] + from, sizeof(float) * (size_t)n);
    if (w->buf && w->unpack) memcpy(w->dst + to, w->buf + w->count, sizeof(float) * (size_t)n);
    w->count += n;
}

/* The floats rank q (shard rank `shard`) gets from rank `server`. */
static int64_t piece_floats(const reshard_map *m, int shard, int server) {
    piece_walk w = {.m = m, .server = server};
    each_piece(m, shard, walk_piece, &w);
    return w.count;
}

/* The newest step committed in these segments, at least floor and below `below` (0: none). */
static int64_t newest_other(keel_snap *const *seg, int n, int64_t floor, int64_t below) {
    int64_t best = 0, have[2];
    for (int i = 0; i < n; i++)
        for (int j = 0, k = keel_snap_steps(seg[i], have); j < k; j++)
            if (have[j] >= floor && have[j] < below && have[j] > best) best = have[j];
    return best;
}

static bool seg_holds(const keel_snap *x, int64_t step) {
    int64_t have[2];
    int n = keel_snap_steps(x, have);
    return (n > 0 && have[0] == step) || (n > 1 && have[1] == step);
}

/* Gather step `step` of the last world (world_size wo, shard ranks so) into
 * this rank's segment and arrays. false: an old shard is nowhere, or failed
 * its checksum (every rank agrees). Collective. */
static bool reshard_step(trainer *t, keel_snap *const *seg, int n, int64_t step, int wo, int so) {
    trainer_snap *s = t->snap;
    int W = t->world_size;
    const keel_fsdp_plan *plan = keel_fsdp_get_plan(t->fsdp);
    const keel_model_layout *lay = trainer_layout(t);
    const float **src = keel_xcalloc(sizeof(float *) * (size_t)so, "reshard");
    keel_snap **here = keel_xcalloc(sizeof(keel_snap *) * (size_t)so, "reshard");
    double *have = keel_xcalloc(sizeof(double) * (size_t)so, "reshard");
    double *all = keel_xmalloc(sizeof(double) * (size_t)so * (size_t)W, "reshard");
    int *server = keel_xmalloc(sizeof(int) * (size_t)so, "reshard");
    for (int i = 0; i < n; i++) {
        keel_snap_shape x = keel_snap_get_shape(seg[i]);
        if (x.world_size == wo && x.shard_ranks == so && x.shard_rank >= 0 && x.shard_rank < so &&
            seg_holds(seg[i], step) && !here[x.shard_rank])
            here[x.shard_rank] = seg[i], have[x.shard_rank] = 1;
    }
    keel_comm_allgather(t->world, have, all, (size_t)so, KEEL_COMM_F64);
    double bad = 0;
    for (int j = 0; j < so; j++) {
        server[j] = -1;
        for (int r = W - 1; r >= 0; r--)
            if (all[(size_t)r * (size_t)so + (size_t)j] != 0) server[j] = r;
        if (server[j] < 0) bad = 1;
        if (server[j] != t->rank) continue;
        keel_error_capture(true);
        keel_status st = keel_snap_get(here[j], step, &src[j]);
        keel_error_capture(false);
        if (st != KEEL_OK) {
            keel_log_warn("%s", keel_last_error());
            keel_event(t->run_dir, "snapshot_damaged", step, "rank %d: %s", t->rank, keel_last_error());
            bad = 1;
        }
    }
    keel_comm_allreduce_scalar(t->world, &bad, KEEL_COMM_MAX);
    if (bad == 0) {
        keel_fsdp_plan old;
        keel_fsdp_plan_init(&old, lay, so);
        reshard_map m = {&old, plan, server};
        int slot;
        float *into = keel_snap_begin(s->own, step, &slot);
        /* round d: rank r serves rank r+d and is served by rank r-d; the
         * exchange is as long as the longest of the round's (every rank agrees) */
        int64_t most = 0, *round = keel_xcalloc(sizeof(int64_t) * (size_t)W, "reshard");
        for (int d = 0; d < W; d++)
            for (int r = 0; r < W; r++) {
                int64_t k = piece_floats(&m, s->shard_of[(r + d) % W], r);
                round[d] = k > round[d] ? k : round[d];
                most = k > most ? k : most;
            }
        float *out = keel_xmalloc(sizeof(float) * (size_t)most + 1, "reshard");
        float *in = keel_xmalloc(sizeof(float) * (size_t)most + 1, "reshard");
        for (int d = 0; d < W; d++) {
            int to = (t->rank + d) % W, from = (t->rank - d + W) % W;
            if (round[d] == 0) continue;
            piece_walk give = {.m = &m, .server = t->rank, .buf = out, .src = src};
            each_piece(&m, s->shard_of[to], walk_piece, &give);
            memset(out + give.count, 0, sizeof(float) * (size_t)(round[d] - give.count)); /* the round's padding */
            piece_walk take = {.m = &m, .server = from, .buf = d ? in : out, .dst = into, .unpack = true};
            if (d) keel_comm_sendrecv(t->world, out, to, in, from, (size_t)round[d], KEEL_COMM_F32);
            each_piece(&m, s->shard_of[t->rank], walk_piece, &take);
        }
        keel_free(out);
        keel_free(in);
        keel_free(round);
        keel_snap_commit(s->own, slot, step);
        trainer_packed_copy_in(&t->packed, into);
        keel_fsdp_plan_free(&old);
    }
    keel_free(src);
    keel_free(here);
    keel_free(have);
    keel_free(all);
    keel_free(server);
    return bad == 0;
}

/* Resume from the last world's segments: the newest step at least `disk`
 * that every old shard can be had at, then older ones. The step, or 0. */
static int64_t reshard(trainer *t, int64_t disk, char *how, size_t how_n) {
    keel_snap **seg;
    int n = keel_snap_open_others(t->run_dir, t->world_size, t->snap->key, &seg);
    int64_t below = INT64_MAX, done = 0;
    for (;;) {
        double step = (double)newest_other(seg, n, disk > 1 ? disk : 1, below), wo = 0, so = 0;
        keel_comm_allreduce_scalar(t->world, &step, KEEL_COMM_MAX);
        if (step <= 0) break;
        for (int i = 0; i < n; i++) /* the world that saved it (the newest, should two have) */
            if (seg_holds(seg[i], (int64_t)step)) {
                keel_snap_shape x = keel_snap_get_shape(seg[i]);
                if (x.world_size > wo) wo = x.world_size, so = x.shard_ranks;
            }
        keel_comm_allreduce_scalar(t->world, &wo, KEEL_COMM_MAX);
        keel_comm_allreduce_scalar(t->world, &so, KEEL_COMM_MAX);
        if (reshard_step(t, seg, n, (int64_t)step, (int)wo, (int)so)) {
            done = (int64_t)step;
            snprintf(how, how_n, ", resharded from %d rank(s)", (int)wo);
            break;
        }
        below = (int64_t)step;
    }
    for (int i = 0; i < n; i++) keel_snap_close(seg[i], false);
    keel_free(seg);
    return done;
}

bool trainer_snap_resume(trainer *t, int64_t disk) {
    trainer_snap *s = t->snap;
    if (s->every <= 0) return false;
    double t0 = keel_now_s();
    int64_t have[2];
    double mine[HELD] = {-1, -1, -1, -1};
    for (int i = 0, n = keel_snap_steps(s->own, have); i < n; i++) mine[i] = (double)have[i];
    for (int i = 0, n = s->replica ? keel_snap_steps(s->replica, have) : 0; i < n; i++) mine[2 + i] = (double)have[i];
    double *held = keel_xmalloc(sizeof(double) * HELD * (size_t)t->world_size, "snapshot steps");
    keel_comm_allgather(t->world, mine, held, HELD, KEEL_COMM_F64);
    bool loaded = false;
    int from_buddies = 0;
    int64_t step = newest_reachable(t, held, disk, INT64_MAX), tried = step;
    while (step > 0 && !(loaded = load(t, step, &from_buddies))) step = newest_reachable(t, held, disk, step);
    char how[96] = "";
    int64_t resharded = loaded ? 0 : reshard(t, disk, how, sizeof how);
    if (resharded > 0) loaded = true, step = resharded;
    /* the last world's segments have served: every rank has read what it needs */
    keel_comm_barrier(t->world);
    keel_snap_remove_other_worlds(t->run_dir, t->world_size);
    if (loaded && t->leader) {
        double secs = keel_now_s() - t0;
        char buddies[160] = "";
        if (from_buddies) snprintf(buddies, sizeof buddies, ", %d of them from their buddies' replicas", from_buddies);
        snprintf(buddies + strlen(buddies), sizeof buddies - strlen(buddies), "%s", how);
        keel_log_info("resuming from the in-memory snapshot of step %lld, verified and loaded in %.2f s%s",
                      (long long)step, secs, buddies);
        keel_event(t->run_dir, "resumed", step, "from memory (the snapshot of step %lld) on %d rank(s)%s; "
                   "load_s %.3f", (long long)step, t->world_size, buddies, secs);
    }
    keel_free(held);
    if (loaded) {
        t->start_step = (int)step;
        t->restored_from = "memory";
    } else if (tried > 0) {
        trainer_packed_clear(&t->packed); /* a checkpoint overwrites every array; a fresh start only the parameters */
    }
    return loaded;
}
