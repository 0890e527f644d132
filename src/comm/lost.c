/* comm/lost.c: how a rank ends when a peer is gone — what the Gloo
 * transport and a node window's waits both do once they have said which. */
#include <stdio.h>
#include <unistd.h>

#include "queue.h"

_Noreturn void comm_end_lost(engine *eng) {
    pthread_mutex_lock(&eng->mu);
    void (*fn)(void *) = eng->on_lost;
    void *ctx = eng->on_lost_ctx;
    pthread_mutex_unlock(&eng->mu);
    if (fn) fn(ctx);
    fflush(NULL);
    _exit(KEEL_EXIT_PEER_LOST);
}
