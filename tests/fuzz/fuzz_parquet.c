/* tests/fuzz/fuzz_parquet.c: bytes as a Parquet file through keel's reader
 * (src/data/parquet.c, parquet_thrift.c, parquet_values.c), what `keel data
 * prepare` runs on every .parquet input. The first byte's low two bits pick
 * the column ("text", "a", "content", "é"); the rest is the file, in a buffer
 * of exactly its size. Every row is read, its bytes touched (so a run that
 * points outside the file or a page is caught), up to a budget of 2^20 runs
 * and 2^20 value bytes a run that bounds the time a file of many rows may
 * take (the reader's own bounds are its page, its dictionary and its
 * footer). Runs must number the rows one after another; a failure must say
 * why in one line, and repeat itself when asked again. */
#include "data/parquet.h"

#include "fuzz.h"

#define MAX_RUNS (1u << 20)

static void expect_error(keel_status st, const char *why, const char *what) {
    if (!why[0]) abort();
    keel_errorf("data prepare: input f.parquet %s", why); /* as keel data prepare prints it */
    fuzz_expect_error_line(st, what);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    fuzz_quiet();
    static const char *const columns[] = {"text", "a", "content", "\xc3\xa9"};
    const char *column = columns[data[0] & 3];
    size_t len = size - 1;
    uint8_t *file = malloc(len ? len : 1);
    if (!file) abort();
    memcpy(file, data + 1, len);
    parquet_reader *r;
    char why[1024] = "";
    keel_status st = parquet_open_memory(file, len, column, &r, why, sizeof why);
    if (st != KEEL_OK) {
        if (r) abort();
        expect_error(st, why, "parquet_open_memory");
        free(file);
        return 0;
    }
    uint64_t next_row = 1, sum = 0;
    for (unsigned n = 0; n < MAX_RUNS; n++) {
        parquet_run run;
        bool end;
        why[0] = '\0';
        st = parquet_next(r, &run, &end, why, sizeof why);
        if (st != KEEL_OK) {
            expect_error(st, why, "parquet_next");
            char again[1024] = "";
            if (parquet_next(r, &run, &end, again, sizeof again) != st || !again[0]) abort();
            break;
        }
        if (end) break;
        if (run.count == 0 || run.first_row != next_row) abort();
        if (!run.text && run.len) abort();
        if (run.len > PARQUET_MAX_PAGE_BYTES) abort();
        for (size_t i = 0; i < run.len && i < (1u << 20); i++) sum += (uint8_t)run.text[i];
        next_row += run.count;
    }
    if (sum == 1) fprintf(stderr, "%s", ""); /* keep the reads */
    parquet_close(r);
    free(file);
    return 0;
}
