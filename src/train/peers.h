/* train/peers.h: in a Slurm task-mode run, where no supervisor watches, each
 * rank watches the others (peers.c). Internal to the train module. */
#ifndef KEEL_TRAIN_PEERS_H
#define KEEL_TRAIN_PEERS_H

#include "keel/run.h"

typedef struct trainer_peers trainer_peers;

/* Watch the other ranks of run_dir's run on a thread of its own, with the
 * supervisor's rules (keel_watch): a peer dead on this node, frozen, stuck
 * past the hang limit, or gone with an error ends this rank — one event
 * naming the lost rank, its node and what it was doing (written by the
 * first rank to find it), one error line, exit KEEL_EXIT_PEER_LOST — so
 * the step ends and the auto-resume plugin's next attempt starts. rc must
 * outlive the watch. */
trainer_peers *trainer_peers_watch(const keel_resilience_config *rc, const char *run_dir, int rank, int world_size,
                                   keel_heartbeat *self);
void trainer_peers_stop(trainer_peers *p);

#endif
