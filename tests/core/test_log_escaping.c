/* Log and error lines cannot be forged: a value with control characters (a
 * config key with an ANSI colour and a newline) is one line with its escapes
 * visible, on stderr and in the log file alike; a 100 KB value is cut with an
 * ellipsis; `keel config show` of a config whose key holds an ESC byte
 * prints one escaped line. */
#include <fcntl.h>
#include <sys/wait.h>

#include "keel/core.h"

#include "../testlib.h"

/* The whole of f (rewound), NUL-ended, in buf. */
static const char *read_back(FILE *f, char *buf, size_t n) {
    fflush(f);
    rewind(f);
    size_t got = fread(buf, 1, n - 1, f);
    buf[got] = 0;
    return buf;
}

static bool has_raw_control(const char *s) {
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 && *s != '\n') return true;
    return false;
}

/* `keel config show PATH`'s exit status, its stderr in err. */
static int keel_config_show(const char *keel, const char *path, char *err, size_t n) {
    FILE *f = tmpfile();
    if (!f) abort();
    pid_t pid = fork();
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(fileno(f), 2);
        execl(keel, keel, "config", "show", path, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    read_back(f, err, n);
    fclose(f);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

int main(void) {
    keel_config cfg;
    keel_config_defaults(&cfg);
    FILE *log_file = tmpfile();
    if (!log_file) abort();
    keel_log_set_file(log_file);

    /* a key with an ANSI colour and a newline: one line, the escapes visible */
    capture_begin();
    keel_status st = keel_config_load_string(&cfg, "{\"train\": {\"st\\u001b[31meps\\nkeel: info: fake\": 1}}", "t.json");
    const char *err = capture_end();
    EXPECT(st == KEEL_ERR_INPUT, "an unknown key is an input error");
    EXPECT(count_lines(err) == 1 && !has_raw_control(err), "one line, no raw control character: %s", err);
    EXPECT(strstr(err, "keel: error: t.json: unknown config key 'train.st\\x1b[31meps\\nkeel: info: fake'") == err,
           "ESC as \\x1b and the newline as \\n: %s", err);
    char file_text[8192];
    read_back(log_file, file_text, sizeof file_text);
    EXPECT(!strcmp(file_text, err), "the log file holds the same line: %s", file_text);

    /* every kind of byte that is not text */
    capture_begin();
    keel_log_warn("tab\there cr\rhere del\x7fhere bell\ahere c1\xc2\x9bhere bad\xffhere utf8 \xc3\xa9\xe2\x80\x94 ok\n");
    err = capture_end();
    EXPECT(!strcmp(err, "keel: warn: tab\\there cr\\rhere del\\x7fhere bell\\x07here c1\\xc2\\x9bhere bad\\xffhere "
                        "utf8 \xc3\xa9\xe2\x80\x94 ok\n"),
           "\\t \\r \\x7f \\x07, a C1 control and ill-formed UTF-8 escaped, UTF-8 text kept, the trailing newline "
           "keel's own: %s", err);

    /* a 100 KB value is cut, and says so */
    size_t big_n = 100 * 1000;
    char *set = malloc(big_n + 32);
    strcpy(set, "train.steps=");
    memset(set + strlen(set), 'v', big_n);
    set[12 + big_n] = 0;
    capture_begin();
    st = keel_config_set(&cfg, set);
    err = capture_end();
    size_t len = strlen(err);
    EXPECT(st == KEEL_ERR_INPUT && count_lines(err) == 1, "a 100 KB value is one error line");
    EXPECT(len <= strlen("keel: error: ") + KEEL_LOG_MAX_MESSAGE + 1, "cut to %d bytes: %zu", KEEL_LOG_MAX_MESSAGE,
           len);
    const char *cut = strstr(err, "...[");
    size_t more = 0;
    EXPECT(cut && sscanf(cut, "...[%zu more bytes]", &more) == 1 && more > 90 * 1000 && more < big_n &&
               !strcmp(err + len - strlen(" more bytes]\n"), " more bytes]\n"),
           "the cut is marked with the bytes left out: %s", cut ? cut : err + len - 40);
    free(set);

    /* a captured error is kept escaped (it may be printed or recorded later) */
    keel_error_capture(true);
    keel_errorf("bad \x1b[2J name");
    keel_error_capture(false);
    EXPECT(!strcmp(keel_last_error(), "bad \\x1b[2J name"), "a captured error is escaped: %s", keel_last_error());

    keel_log_set_file(NULL);
    fclose(log_file);
    keel_config_free(&cfg);

    /* the CLI: `keel config show` of a config whose key holds an ESC byte */
    const char *keel = getenv("KEEL_BIN");
    char dir[256], path[300];
    if (keel && temp_dir_create(dir, sizeof dir, "log-escaping")) {
        snprintf(path, sizeof path, "%s/evil.json", dir);
        FILE *f = fopen(path, "w");
        fputs("{\"train\": {\"steps\": 3, \"lr\x1b]0;owned\x07\": 1}}\n", f);
        fclose(f);
        char text[8192];
        int rc = keel_config_show(keel, path, text, sizeof text);
        EXPECT(rc == 2 && count_lines(text) == 1 && !has_raw_control(text) && strstr(text, "keel: error: ") == text &&
                   strstr(text, "'train.lr\\x1b]0;owned\\x07'"),
               "keel config show: exit 2, one escaped line: %s", text);
        remove_tree(dir);
    } else {
        EXPECT(keel != NULL, "KEEL_BIN names the keel binary (ctest sets it)");
    }
    return test_summary("test_log_escaping");
}
