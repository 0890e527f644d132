"""tests/data/split_check.py: corpus layouts and split statistics for
data_split_by_hash.sh (standard library only).

  corpus OUT GZ...      distinct documents of the gzip'd texts (keel's rule: blocks of
                        non-blank lines) as OUT/corpus.txt (~3 MB), one huge document
                        OUT/huge.txt, OUT/all.txt (corpus with huge in the middle), the
                        corpus reordered over many files OUT/shuffled/*, and all.txt cut
                        into many files in order OUT/pieces/*
  ks DIR                val vs train document lengths: two-sample Kolmogorov-Smirnov
                        statistic against its critical value at alpha = 0.001; exit 1 if
                        above, or if val's token share is not within 0.08-0.12
  same-docs DIR1 DIR2   each split holds the same documents (as multisets) in both
  other-val DIR1 DIR2   the val splits differ (another seed draws another sample)
"""
import array
import collections
import glob
import gzip
import math
import os
import random
import struct
import sys

BOS, EOS = 1, 2  # spm_train's defaults
CORPUS_BYTES = 3_000_000
HUGE_BYTES = 1_000_000  # ~300k tokens: several 65536-token chunks
SHORT_TOKENS = 20


def documents(text):
    """Blocks of non-blank lines (blank: only spaces, tabs, CRs), as keel reads them:
    each a tuple of lines without line ends."""
    doc = []
    for line in text.split(b"\n") + [b""]:
        if line.strip(b" \t\r") == b"":
            if doc:
                yield tuple(doc)
            doc = []
        else:
            doc.append(line.rstrip(b"\r"))


def write_docs(path, docs, crlf=False, sep=b"\n", final_newline=True):
    end = b"\r\n" if crlf else b"\n"
    out = sep.join(end.join(d) + end for d in docs)
    if not final_newline:
        out = out[: -len(end)]
    with open(path, "wb") as f:
        f.write(out)


def cut(docs, n_files):
    step = max(1, math.ceil(len(docs) / n_files))
    return [docs[i : i + step] for i in range(0, len(docs), step)]


def make_corpus(out, paths):
    seen, docs, size = set(), [], 0
    for p in paths:
        # Debian ships one changelog in every binary package of a source package:
        # duplicates share a hash (so a split), and would make the KS sample
        # look larger than it is.
        for d in documents(gzip.open(p).read()):
            if d not in seen and size < CORPUS_BYTES:
                seen.add(d)
                docs.append(d)
                size += sum(len(l) + 1 for l in d) + 1
    lines = [l for d in docs for l in d]
    huge, size = [], 0
    while size < HUGE_BYTES:
        huge.append(lines[len(huge)])
        size += len(huge[-1]) + 1
    huge = tuple(huge)
    write_docs(f"{out}/corpus.txt", docs)
    write_docs(f"{out}/huge.txt", [huge])
    everything = docs[: len(docs) // 2] + [huge] + docs[len(docs) // 2 :]
    write_docs(f"{out}/all.txt", everything)
    # The same documents in another order over 37 files: CRLF ends, separators of
    # spaces/tabs and several blank lines, a last line without its newline.
    shuffled = list(docs)
    random.Random(12345).shuffle(shuffled)
    os.makedirs(f"{out}/shuffled")
    for i, part in enumerate(cut(shuffled, 37)):
        write_docs(f"{out}/shuffled/{i:03d}.txt", part, crlf=i % 3 == 0,
                   sep=[b"\n", b" \t\n\n", b"\n\n\n"][i % 3], final_newline=i % 4 != 1)
    # all.txt in order over 41 files (the huge document within one of them).
    os.makedirs(f"{out}/pieces")
    for i, part in enumerate(cut(everything, 41)):
        write_docs(f"{out}/pieces/{i:03d}.txt", part)
    print(f"corpus: {len(docs)} distinct documents, {os.path.getsize(f'{out}/corpus.txt')} bytes; "
          f"huge document {os.path.getsize(f'{out}/huge.txt')} bytes")


def split_docs(d, split):
    """The documents (token tuples, BOS..EOS) of one split of a prepared directory."""
    docs, cur = [], []
    for f in sorted(glob.glob(f"{d}/{split}-*.bin")):
        b = open(f, "rb").read()
        token_bytes, n = struct.unpack_from("<IQ", b, 12)
        ids = array.array("H" if token_bytes == 2 else "I")
        ids.frombytes(b[64:64 + n * token_bytes])  # the bitmaps after the ids left out
        for t in ids:
            cur.append(t)
            if t == EOS:
                docs.append(tuple(cur))
                cur = []
    if cur:
        sys.exit(f"FAIL: {d}: {split} ends inside a document")
    return docs


def ks_statistic(x, y):
    x, y = sorted(x), sorted(y)
    i = j = 0
    d = 0.0
    while i < len(x) and j < len(y):
        v = min(x[i], y[j])
        while i < len(x) and x[i] == v:
            i += 1
        while j < len(y) and y[j] == v:
            j += 1
        d = max(d, abs(i / len(x) - j / len(y)))
    return d


def ks(d):
    train = [len(x) for x in split_docs(d, "train")]
    val = [len(x) for x in split_docs(d, "val")]
    n, m = len(train), len(val)
    if m < 1000:
        sys.exit(f"FAIL: only {m} val documents; the test needs a bigger corpus")
    for name, lens in (("train", train), ("val", val)):
        short = sum(1 for v in lens if v <= SHORT_TOKENS) / len(lens)
        print(f"{name}: {len(lens)} documents, mean {sum(lens) / len(lens):.1f} tokens, "
              f"{100 * short:.1f}% <= {SHORT_TOKENS} tokens")
    # Documents are distinct, so their coins are independent: D exceeds this with
    # probability <= 0.001 when both splits draw from one length distribution
    # (less for integer lengths, where the test is conservative).
    bound = math.sqrt(-math.log(0.001 / 2) / 2) * math.sqrt((n + m) / (n * m))
    d_stat = ks_statistic(train, val)
    share = sum(val) / (sum(val) + sum(train))
    print(f"KS statistic {d_stat:.4f}, bound {bound:.4f} (alpha 0.001); val token share {share:.4f}")
    if d_stat >= bound:
        sys.exit(f"FAIL: val and train document lengths differ: KS {d_stat:.4f} >= {bound:.4f}")
    # ~24k documents: the share's standard deviation is ~0.4 points.
    if not 0.08 <= share <= 0.12:
        sys.exit(f"FAIL: val holds {share:.4f} of the tokens, not 0.08-0.12 (--val-fraction 0.1)")


def same_docs(d1, d2):
    for split in ("train", "val"):
        a = collections.Counter(split_docs(d1, split))
        b = collections.Counter(split_docs(d2, split))
        if a != b:
            only1, only2 = sum((a - b).values()), sum((b - a).values())
            sys.exit(f"FAIL: {split} differs: {only1} documents only in {d1}, {only2} only in {d2}")
        print(f"{split}: the same {sum(a.values())} documents in {d1} and {d2}")


def other_val(d1, d2):
    a, b = set(split_docs(d1, "val")), set(split_docs(d2, "val"))
    if a == b:
        sys.exit(f"FAIL: {d1} and {d2} hold the same val documents")
    print(f"val: {len(a & b)} documents in common of {len(a)} and {len(b)}")


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "corpus":
        make_corpus(args[0], args[1:])
    elif cmd == "ks":
        ks(args[0])
    elif cmd == "same-docs":
        same_docs(args[0], args[1])
    elif cmd == "other-val":
        other_val(args[0], args[1])
    else:
        sys.exit(f"unknown command {cmd}")
