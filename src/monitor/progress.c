/* monitor/progress.c: the training progress line — redrawn in place on a
 * terminal, plain lines otherwise. */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "keel/monitor.h"

void keel_progress_init(keel_progress *p, FILE *out, int total_steps) {
    memset(p, 0, sizeof *p);
    p->out = out;
    /* A distributed run's leader learns from the launcher whether the user's
     * stdout is a terminal (its own stdout is mpirun's). */
    const char *env = getenv("KEEL_TTY");
    p->tty = env ? atoi(env) != 0 : isatty(fileno(out));
    p->total_steps = total_steps;
    p->plain_every = total_steps <= 100 ? 1 : total_steps / 100;
}

static void format_duration(char *buf, size_t n, double s) {
    if (s < 0 || s > 1e8) snprintf(buf, n, "?");
    else if (s < 60) snprintf(buf, n, "%.0fs", s);
    else if (s < 3600) snprintf(buf, n, "%dm%02ds", (int)s / 60, (int)s % 60);
    else snprintf(buf, n, "%dh%02dm", (int)s / 3600, (int)s % 3600 / 60);
}

void keel_progress_step(keel_progress *p, int step, double loss, double tokens_per_s, double mfu,
                        double elapsed_s) {
    char eta[32], spent[32];
    format_duration(eta, sizeof eta, elapsed_s / step * (p->total_steps - step));
    format_duration(spent, sizeof spent, elapsed_s);
    int width = 1;
    for (int t = p->total_steps; t >= 10; t /= 10) width++;
    char line[256], mfu_text[16] = "?"; /* a device whose peak keel does not know */
    if (isfinite(mfu)) snprintf(mfu_text, sizeof mfu_text, "%.1f%%", 100 * mfu);
    snprintf(line, sizeof line, "step %*d/%d | loss %.4f | %.0f tok/s | MFU %s | %s elapsed | ETA %s", width,
             step, p->total_steps, loss, tokens_per_s, mfu_text, spent, eta);
    if (p->tty) {
        /* Redraw in place, but leave every tenth of the run on screen so the
         * loss curve stays readable. */
        int tenth = p->total_steps >= 10 ? p->total_steps / 10 : 1;
        bool keep = step % tenth == 0 || step == p->total_steps;
        fprintf(p->out, "\r\033[K%s%s", line, keep ? "\n" : "");
        p->line_open = !keep;
    } else if (step % p->plain_every == 0 || step == p->total_steps) {
        fprintf(p->out, "%s\n", line);
    }
    fflush(p->out);
}

void keel_progress_note(keel_progress *p, const char *fmt, ...) {
    if (p->line_open) fputs("\r\033[K", p->out);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(p->out, fmt, ap);
    va_end(ap);
    fputc('\n', p->out);
    p->line_open = false;
    fflush(p->out);
}

void keel_progress_end(keel_progress *p) {
    if (p->line_open) fputc('\n', p->out);
    p->line_open = false;
    fflush(p->out);
}
