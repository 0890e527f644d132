/* monitor/status.c: `keel status` — the run's state at a glance in a terminal
 * (the run's htop), and `keel plot` — its loss and throughput curves with the
 * failures and recoveries marked, as SVG. Both read the run directory through
 * the exporter's JSON view, as the dashboard does. */
#include <cairo.h>
#include <cjson/cJSON.h>
#include <librsvg/rsvg.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "keel/monitor.h"
#include "keel/run.h"

/* The exporter's view of run_dir, parsed; an error line when it is not a run. */
static keel_status load_view(const char *run_dir, cJSON **out) {
    char path[4200];
    keel_run_path(path, sizeof path, run_dir, KEEL_RUN_CONFIG);
    if (!keel_path_exists(path)) {
        keel_errorf("%s: not a run directory (no %s): give the --run-dir of a keel train run", run_dir,
                    KEEL_RUN_CONFIG);
        return KEEL_ERR_INPUT;
    }
    keel_exporter *x = keel_exporter_new(run_dir);
    char *text = keel_exporter_json(x);
    keel_exporter_free(x);
    *out = cJSON_Parse(text);
    free(text);
    return KEEL_OK;
}

static double num(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static const char *str(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : "-";
}

/* The last value of column key of the steps table (NAN when none). */
static double last_of(const cJSON *steps, const char *key) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(steps, key);
    int n = cJSON_GetArraySize(a);
    for (int i = n - 1; i >= 0; i--) {
        const cJSON *v = cJSON_GetArrayItem(a, i);
        if (cJSON_IsNumber(v)) return v->valuedouble;
    }
    return NAN;
}

static void cell(FILE *out, double v, const char *fmt, int width) {
    if (isnan(v)) fprintf(out, " %*s", width > 0 ? width : 1, "-");
    else fprintf(out, fmt, width, v);
}

static int total_steps(const char *run_dir) {
    keel_config cfg;
    keel_config_defaults(&cfg);
    char path[4200];
    keel_run_path(path, sizeof path, run_dir, KEEL_RUN_CONFIG);
    keel_error_capture(true);
    int steps = keel_config_load_file(&cfg, path) == KEEL_OK ? cfg.train.steps : -1;
    keel_error_capture(false);
    keel_config_free(&cfg);
    return steps;
}

/* The line naming RUN/endpoint.json's URL, when a process serves the run;
 * a file left by one that was killed (its pid gone from this node) is
 * called stale. Nothing when there is no file. */
static void print_endpoint(const char *run_dir, FILE *out) {
    char path[4200], *text = NULL;
    keel_run_path(path, sizeof path, run_dir, KEEL_RUN_ENDPOINT);
    if (!keel_path_exists(path)) return;
    keel_error_capture(true);
    keel_status st = keel_read_file(path, &text, NULL);
    keel_error_capture(false);
    cJSON *e = st == KEEL_OK ? cJSON_Parse(text) : NULL;
    keel_free(text);
    const char *url = str(e, "url"), *node = str(e, "node");
    double pid = num(e, "pid");
    char here[256], dashboard[160];
    keel_node_name(here, sizeof here);
    snprintf(dashboard, sizeof dashboard, "%s", url);
    char *tail = strstr(dashboard, "/metrics");
    if (tail) tail[1] = 0;
    bool gone = !strcmp(node, here) && pid > 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH;
    if (!e || !strcmp(url, "-")) fprintf(out, "endpoint: %s is not readable\n", path);
    else if (gone) fprintf(out, "endpoint %s (stale: keel pid %.0f on %s is gone)\n", url, pid, node);
    else fprintf(out, "endpoint %s | dashboard %s\n", url, dashboard);
    cJSON_Delete(e);
}

keel_status keel_run_status_print(const char *run_dir, FILE *out, bool json) {
    cJSON *v;
    keel_status st = load_view(run_dir, &v);
    if (st != KEEL_OK) return st;
    if (json) {
        char *text = cJSON_Print(v);
        fprintf(out, "%s\n", text);
        free(text);
        cJSON_Delete(v);
        return KEEL_OK;
    }
    const cJSON *steps = cJSON_GetObjectItemCaseSensitive(v, "steps");
    double step = last_of(steps, "step"), mfu = last_of(steps, "mfu");
    char summary[4200], state[64] = "running or stopped";
    keel_run_path(summary, sizeof summary, run_dir, KEEL_RUN_SUMMARY);
    char *text = NULL;
    keel_error_capture(true);
    if (keel_path_exists(summary) && keel_read_file(summary, &text, NULL) == KEEL_OK) {
        cJSON *s = cJSON_Parse(text);
        snprintf(state, sizeof state, "%s", str(s, "status"));
        cJSON_Delete(s);
    }
    keel_error_capture(false);
    keel_free(text);
    fprintf(out, "run %s (%s)\n", run_dir, state);
    print_endpoint(run_dir, out);
    fprintf(out, "step %.0f of %d | loss", isnan(step) ? 0 : step, total_steps(run_dir));
    cell(out, last_of(steps, "loss"), " %*.4f", 0);
    fprintf(out, " | val loss");
    cell(out, last_of(steps, "val_loss"), " %*.4f", 0);
    fprintf(out, " |");
    cell(out, last_of(steps, "tokens_per_s"), " %*.0f", 0);
    fprintf(out, " tokens/s | MFU");
    cell(out, 100 * mfu, " %*.1f%%", 0);
    fprintf(out, " | checkpoint at step");
    cell(out, num(v, "checkpoint_step"), " %*.0f", 0);
    fprintf(out, "\n");
    fprintf(out, "restarts %.0f | drained nodes %.0f | failures:", num(v, "restarts"), num(v, "drained_nodes"));
    const cJSON *f;
    int any = 0;
    cJSON_ArrayForEach(f, cJSON_GetObjectItemCaseSensitive(v, "failures")) if (f->valuedouble > 0) {
        fprintf(out, " %s %.0f", f->string, f->valuedouble);
        any++;
    }
    fprintf(out, "%s\n\n", any ? "" : " none");
    fprintf(out, "%4s  %-16s %-10s %7s %10s %9s %8s %9s %8s %5s\n", "rank", "node", "phase", "step", "heartbeat",
            "progress", "step s", "compute s", "RSS GiB", "CPU");
    const cJSON *r;
    cJSON_ArrayForEach(r, cJSON_GetObjectItemCaseSensitive(v, "ranks")) {
        /* in training, what the rank is doing: forward, backward, wait (on a collective), checkpoint, ... */
        const char *phase = str(r, "phase");
        fprintf(out, "%4.0f  %-16.16s %-10.10s %7.0f", num(r, "rank"), str(r, "node"),
                strcmp(phase, "train") || !*str(r, "doing") ? phase : str(r, "doing"), num(r, "step"));
        double age = num(r, "heartbeat_age_s"), progress = num(r, "progress_age_s");
        char ago[32];
        snprintf(ago, sizeof ago, age < 100 ? "%.1f s ago" : "%.0f s ago", age);
        fprintf(out, " %10s", ago);
        snprintf(ago, sizeof ago, isnan(progress) ? "-" : progress < 100 ? "%.1f s ago" : "%.0f s ago", progress);
        fprintf(out, " %9s", ago);
        cell(out, num(r, "step_s"), " %*.3f", 8);
        cell(out, num(r, "compute_s"), " %*.3f", 9);
        cell(out, num(r, "rss_bytes") / (1 << 30), " %*.2f", 8);
        cell(out, 100 * num(r, "cpu_utilization"), " %*.0f%%", 4);
        fprintf(out, "\n");
    }
    const cJSON *events = cJSON_GetObjectItemCaseSensitive(v, "events");
    int n = cJSON_GetArraySize(events);
    fprintf(out, "\nlast events:\n");
    for (int i = n > 8 ? n - 8 : 0; i < n; i++) {
        const cJSON *e = cJSON_GetArrayItem(events, i);
        time_t t = (time_t)num(e, "unix_s");
        char when[16];
        strftime(when, sizeof when, "%H:%M:%S", localtime(&t));
        double es = num(e, "step");
        fprintf(out, "  %s %-20s", when, str(e, "event"));
        if (!isnan(es)) fprintf(out, " step %.0f:", es);
        fprintf(out, " %.160s\n", str(e, "detail"));
    }
    /* train.sample_every: the newest step's samples, one line each */
    const cJSON *samples = cJSON_GetObjectItemCaseSensitive(v, "samples");
    int ns = cJSON_GetArraySize(samples);
    double newest = ns ? num(cJSON_GetArrayItem(samples, ns - 1), "step") : NAN;
    if (ns) fprintf(out, "\nsamples at step %.0f:\n", newest);
    for (int i = 0; i < ns; i++) {
        const cJSON *e = cJSON_GetArrayItem(samples, i);
        if (num(e, "step") != newest) continue;
        char line[200];
        int k = snprintf(line, sizeof line, "[%s] %s", str(e, "prompt"), str(e, "completion"));
        for (int j = 0; j < k && j < (int)sizeof line - 1; j++)
            if (line[j] == '\n' || line[j] == '\r' || line[j] == '\t') line[j] = ' ';
        fprintf(out, "  %.180s\n", line);
    }
    cJSON_Delete(v);
    return KEEL_OK;
}

/* ---- keel plot ------------------------------------------------------------------------ */

enum { PLOT_W = 900, PLOT_H = 560 }; /* the page, in SVG units (the PNG has twice the pixels) */

/* Text in an SVG element: &, < and > escaped. */
static void xml_text(keel_strbuf *out, const char *s) {
    for (; *s; s++) {
        if (*s == '&') keel_strbuf_printf(out, "&amp;");
        else if (*s == '<') keel_strbuf_printf(out, "&lt;");
        else if (*s == '>') keel_strbuf_printf(out, "&gt;");
        else keel_strbuf_printf(out, "%c", *s);
    }
}

typedef struct {
    double x0, x1, y0, y1;  /* data range */
    double left, top, w, h; /* the panel on the page */
} panel;

static double px(const panel *p, double x) { return p->left + (x - p->x0) / (p->x1 - p->x0) * p->w; }
static double py(const panel *p, double y) { return p->top + (1 - (y - p->y0) / (p->y1 - p->y0)) * p->h; }

/* A tick's number in at most 4 significant digits: 95.6k rather than 9.56e+04. */
static void tick_label(char *out, size_t n, double v) {
    if (fabs(v) >= 1e9) snprintf(out, n, "%.3gG", v / 1e9);
    else if (fabs(v) >= 1e6) snprintf(out, n, "%.3gM", v / 1e6);
    else if (fabs(v) >= 1e4) snprintf(out, n, "%.3gk", v / 1e3);
    else snprintf(out, n, "%.4g", v);
}

/* One panel: axes, ticks, a series per column, and markers at event steps. */
static void plot_panel(keel_strbuf *out, panel *p, const cJSON *steps, const char *const *cols,
                       const char *const *colors, int n_cols, const char *title, const cJSON *events, bool from_zero) {
    const cJSON *xs = cJSON_GetObjectItemCaseSensitive(steps, "step");
    int n = cJSON_GetArraySize(xs);
    p->x0 = INFINITY, p->x1 = -INFINITY, p->y0 = INFINITY, p->y1 = -INFINITY;
    for (int c = 0; c < n_cols; c++) {
        const cJSON *ys = cJSON_GetObjectItemCaseSensitive(steps, cols[c]);
        for (int i = 0; i < n; i++) {
            const cJSON *y = cJSON_GetArrayItem(ys, i);
            if (!cJSON_IsNumber(y)) continue;
            double x = cJSON_GetArrayItem(xs, i)->valuedouble;
            p->x0 = fmin(p->x0, x), p->x1 = fmax(p->x1, x), p->y0 = fmin(p->y0, y->valuedouble),
            p->y1 = fmax(p->y1, y->valuedouble);
        }
    }
    keel_strbuf_printf(out, "<text x=\"%.0f\" y=\"%.0f\" class=\"title\">%s</text>\n", p->left, p->top - 8, title);
    if (!isfinite(p->x0)) {
        keel_strbuf_printf(out, "<text x=\"%.0f\" y=\"%.0f\" class=\"tick\">no steps yet</text>\n", p->left + 10,
                           p->top + 20);
        return;
    }
    if (from_zero) p->y0 = fmin(0, p->y0);
    if (p->x1 == p->x0) p->x1 = p->x0 + 1;
    if (p->y1 == p->y0) p->y1 = p->y0 + (fabs(p->y0) > 0 ? fabs(p->y0) * 0.1 : 1);
    double pad = 0.05 * (p->y1 - p->y0);
    p->y1 += pad;
    if (!from_zero) p->y0 -= pad;
    for (int k = 0; k <= 4; k++) {
        double y = p->y0 + (p->y1 - p->y0) * k / 4, x = p->x0 + (p->x1 - p->x0) * k / 4;
        keel_strbuf_printf(out, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" class=\"grid\"/>\n", p->left,
                           p->left + p->w, py(p, y), py(p, y));
        char label[32];
        tick_label(label, sizeof label, y);
        keel_strbuf_printf(out, "<text x=\"%.1f\" y=\"%.1f\" class=\"tick\" text-anchor=\"end\">%s</text>\n",
                           p->left - 4, py(p, y) + 3, label);
        keel_strbuf_printf(out, "<text x=\"%.1f\" y=\"%.1f\" class=\"tick\" text-anchor=\"middle\">%.0f</text>\n",
                           px(p, x), p->top + p->h + 14, x);
    }
    keel_strbuf_printf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" class=\"frame\"/>\n", p->left,
                       p->top, p->w, p->h);
    const cJSON *e;
    cJSON_ArrayForEach(e, events) {
        const char *type = str(e, "event");
        double s = num(e, "step");
        bool failure = cJSON_IsString(cJSON_GetObjectItemCaseSensitive(e, "cause"));
        bool recovered = !strcmp(type, "recovered");
        if ((!failure && !recovered) || isnan(s) || s < p->x0 || s > p->x1) continue;
        keel_strbuf_printf(out, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" class=\"%s\"><title>", px(p, s),
                           px(p, s), p->top, p->top + p->h, failure ? "failure" : "recovery");
        xml_text(out, type);
        keel_strbuf_printf(out, " step %.0f</title></line>\n", s);
    }
    for (int c = 0; c < n_cols; c++) {
        const cJSON *ys = cJSON_GetObjectItemCaseSensitive(steps, cols[c]);
        keel_strbuf_printf(
            out,
            "<polyline class=\"series\" data-series=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"",
            cols[c], colors[c]);
        int points = 0;
        for (int i = 0; i < n; i++) {
            const cJSON *y = cJSON_GetArrayItem(ys, i);
            if (!cJSON_IsNumber(y)) continue;
            keel_strbuf_printf(out, "%s%.1f,%.1f", points++ ? " " : "", px(p, cJSON_GetArrayItem(xs, i)->valuedouble),
                               py(p, y->valuedouble));
        }
        keel_strbuf_printf(out, "\"/>\n");
    }
}

/* The plot as an SVG document. */
static void plot_svg(keel_strbuf *out, const char *run_dir, const cJSON *v) {
    const cJSON *steps = cJSON_GetObjectItemCaseSensitive(v, "steps");
    const cJSON *events = cJSON_GetObjectItemCaseSensitive(v, "events");
    keel_strbuf_printf(out,
                       "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                       "viewBox=\"0 0 %d %d\">\n",
                       PLOT_W, PLOT_H, PLOT_W, PLOT_H);
    keel_strbuf_printf(out,
                       "<style>.title{font:600 14px sans-serif;fill:#1d2430}.tick{font:10px sans-serif;fill:#6b7280}"
                       ".grid{stroke:#eceef2}.frame{fill:none;stroke:#9aa3af}"
                       ".failure{stroke:#dc2626;stroke-dasharray:4,3}.recovery{stroke:#2563eb;stroke-dasharray:2,3}"
                       ".legend{font:11px sans-serif;fill:#374151}</style>\n"
                       "<rect width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n",
                       PLOT_W, PLOT_H);
    static const char *const loss_cols[] = {"loss", "val_loss"}, *const loss_colors[] = {"#2563eb", "#dc2626"};
    static const char *const tps_cols[] = {"tokens_per_s"}, *const tps_colors[] = {"#059669"};
    panel a = {.left = 60, .top = 40, .w = 810, .h = 200}, b = {.left = 60, .top = 310, .w = 810, .h = 200};
    plot_panel(out, &a, steps, loss_cols, loss_colors, 2, "loss (blue) and val loss (red) by step", events, false);
    plot_panel(out, &b, steps, tps_cols, tps_colors, 1, "tokens/s (all ranks) by step", events, true);
    keel_strbuf_printf(out, "<text x=\"60\" y=\"545\" class=\"legend\">");
    xml_text(out, run_dir);
    keel_strbuf_printf(out, " — dashed red: failures, dashed blue: recoveries</text>\n</svg>\n");
}

/* The SVG drawn by librsvg into a 2x bitmap, written as PNG by cairo (to a tmp file, renamed). */
static keel_status write_png(const keel_strbuf *svg, const char *out_path) {
    GError *err = NULL;
    RsvgHandle *h = rsvg_handle_new_from_data((const guint8 *)svg->s, svg->n, &err);
    cairo_surface_t *surface = cairo_image_surface_create(CAIRO_FORMAT_ARGB32, 2 * PLOT_W, 2 * PLOT_H);
    cairo_t *cr = cairo_create(surface);
    cairo_scale(cr, 2, 2);
    RsvgRectangle viewport = {0, 0, PLOT_W, PLOT_H};
    bool drawn = h && rsvg_handle_render_document(h, cr, &viewport, &err);
    cairo_destroy(cr);
    keel_status st = KEEL_OK;
    if (!drawn) {
        keel_errorf("keel plot: cannot draw the plot: %s (a bug in keel: report it)", err ? err->message : "?");
        st = KEEL_ERR_INTERNAL;
    } else {
        char tmp[4200];
        snprintf(tmp, sizeof tmp, "%s.tmp", out_path);
        cairo_status_t cs = cairo_surface_write_to_png(surface, tmp);
        if (cs != CAIRO_STATUS_SUCCESS || rename(tmp, out_path) != 0) {
            keel_errorf("%s: cannot write: %s", out_path,
                        cs != CAIRO_STATUS_SUCCESS ? cairo_status_to_string(cs) : strerror(errno));
            remove(tmp);
            st = KEEL_ERR_IO;
        }
    }
    cairo_surface_destroy(surface);
    if (h) g_object_unref(h);
    if (err) g_error_free(err);
    return st;
}

keel_status keel_run_plot(const char *run_dir, const char *out_path) {
    size_t n = strlen(out_path);
    bool png = n > 4 && !strcmp(out_path + n - 4, ".png"), svg = n > 4 && !strcmp(out_path + n - 4, ".svg");
    if (!png && !svg) {
        keel_errorf("keel plot --out %s: name an .svg or a .png file", out_path);
        return KEEL_ERR_INPUT;
    }
    cJSON *v;
    keel_status st = load_view(run_dir, &v);
    if (st != KEEL_OK) return st;
    keel_strbuf doc = {0};
    plot_svg(&doc, run_dir, v);
    cJSON_Delete(v);
    st = png ? write_png(&doc, out_path) : keel_write_file_atomic(out_path, doc.s, doc.n);
    keel_free(doc.s);
    return st;
}
