#!/usr/bin/env bash
# Build a real-English text corpus (~15 MB, UTF-8) from Debian packages:
#
#   OUT_DIR/austen.txt       six Jane Austen novels           (r-cran-janeaustenr)
#   OUT_DIR/novels.txt       Great Expectations, The War of the Worlds, Twenty Thousand
#                            Leagues under the Sea (r-cran-tidytext), Moby Dick (r-cran-tokenizers)
#   OUT_DIR/bible-web.txt    World English Bible with deuterocanon (sword-text-web + diatheke)
#   OUT_DIR/fortunes.txt     English fortune-cookie quotes    (fortunes, fortunes-min)
#   OUT_DIR/fortunes-de.txt  German fortunes, ~0.2 MB: non-ASCII text (fortunes-de)
#
# Format: prose has one paragraph per line; the Bible one verse per line (a book's name
# and psalm titles on their own lines); fortunes keep their own lines. Documents (a
# novel, a Bible book, a fortune) are separated by one blank line. Gutenberg headers,
# footers, transcriber's notes, footnotes, _italic_ underscores, CRs, tabs and control
# characters are removed; runs of spaces are collapsed.
#
# usage: scripts/build_corpus.sh OUT_DIR
# Cached: does nothing if OUT_DIR/.complete matches this script's version. Installs the
# packages it needs (only the missing ones; see scripts/install-deps.sh).
set -euo pipefail

CORPUS_VERSION=1
FILES=(austen.txt novels.txt bible-web.txt fortunes.txt fortunes-de.txt)
WEB_MODULE=engWEB2015eb
FORTUNES_DE=(anekdoten gedichte kinderzitate letzteworte mathematiker murphy regeln
             sprichworte sprueche stilblueten wusstensie)

if [ $# -ne 1 ] || [ -z "$1" ] || [[ $1 == -* ]]; then
    echo "usage: $0 OUT_DIR" >&2
    exit 2
fi
out=$1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
stamp="keel-corpus v$CORPUS_VERSION $(sha256sum < "${BASH_SOURCE[0]}" | cut -c1-16)"

summary() { # DIR FILE...
    local dir=$1 f bytes total=0; shift
    for f in "$@"; do
        bytes=$(stat -c %s "$dir/$f")
        total=$((total + bytes))
        printf 'corpus: %-16s %6.2f MB %7d lines\n' "$f" "$(echo "$bytes" | awk '{print $1/1e6}')" \
            "$(wc -l < "$dir/$f")"
    done
    printf 'corpus: %-16s %6.2f MB in %s\n' total "$(echo "$total" | awk '{print $1/1e6}')" "$dir"
}

is_complete() { [ -f "$out/.complete" ] && [ "$(cat "$out/.complete")" = "$stamp" ]; }

if is_complete; then
    echo "corpus: up to date in $out"
    exit 0
fi
mkdir -p "$out"
exec 9>"$out/.lock"
flock 9                      # one builder per OUT_DIR
if is_complete; then echo "corpus: up to date in $out"; exit 0; fi
rm -f "$out/.complete"
t0=$SECONDS

# ---- packages ----------------------------------------------------------------
# shellcheck source=install-deps.sh
. "$here/install-deps.sh"
keel_apt_ensure "${KEEL_CORPUS_DEPS[@]}"
work="$out/.work"
rm -rf "$work"
mkdir -p "$work"
keel_apt_fetch "$work/pkg" "${KEEL_CORPUS_DATA[@]}"
rlib=usr/lib/R/site-library
for f in "$work/pkg/r-cran-tidytext/$rlib/tidytext/extdata/books.rda" \
         "$work/pkg/r-cran-tokenizers/$rlib/tokenizers/data/Rdata.rdb"; do
    [ -f "$f" ] || { echo "corpus: ERROR: $f not in the package (layout changed?)" >&2; exit 1; }
done

# ---- the Bible (slowest step: runs while R and the rest work) ---------------
mods=$(diatheke -b system -k modulelist 2>/dev/null || true)
if ! grep -q "^$WEB_MODULE " <<<"$mods"; then
    echo "corpus: ERROR: SWORD module $WEB_MODULE not found (is sword-text-web installed?)" >&2
    exit 1
fi
# OSIS with footnotes (f) and psalm titles (h): the footnotes are removed below, restoring
# the word space that the module loses at them ("God[note]created" -> "God created").
diatheke -b "$WEB_MODULE" -f OSIS -o fh -k 'Gen 1:1-Rev 22:21' > "$work/web.osis" \
    2> "$work/diatheke.log" &
bible_pid=$!
trap 'kill "$bible_pid" 2>/dev/null || true' EXIT   # on an error below

# ---- cleaners -------------------------------------------------------------------
# Prose: raw lines, "\f" lines between documents -> one paragraph per line.
cat > "$work/prose.pl" <<'PERL'
use strict; use warnings;
binmode STDIN, ':raw'; binmode STDOUT, ':utf8';
local $/; my $t = <STDIN>;
utf8::decode($t) or die "prose.pl: input is not UTF-8\n";
$t =~ s/\r//g;
$t =~ s/\x{feff}//g;                                   # BOM (Moby Dick)
my @drop = (                                           # editorial paragraphs, not the books
    qr/^\[(?:Transcriber|Project Gutenberg|At this point in the first|End volume|1867 Edition)/i,
    qr/^\[\d+\] /,                                     # footnote text (20,000 Leagues)
    qr/^This etext was done by/, qr/^Produced by /, qr/^Original Transcriber's Notes:/,
    qr/^This text is a combination of etexts/, qr/^In chapters 24, 89, and 90, we substituted/,
);
my $first = 1;
for my $d (split /^\f\n/m, $t) {
    # Gutenberg header / footer (Moby Dick; the R packages stripped the others')
    $d = $' if $d =~ /^\*\*\* ?START OF (?:THE|THIS) PROJECT GUTENBERG[^\n]*\n/m;
    $d =~ s/^(?:End of (?:the )?Project Gutenberg|\*\*\* ?END OF (?:THE|THIS) PROJECT GUTENBERG).*//ms;
    my @par;
    for my $p (split /\n[ \t]*(?:\n[ \t]*)+/, $d) {
        $p =~ s/[\x00-\x1f\x7f-\x{a0}]/ /g;               # newlines, tabs, C1, NBSP -> space
        $p =~ s/ {2,}/ /g; $p =~ s/^ //; $p =~ s/ $//;
        next if $p eq '' || grep { $p =~ $_ } @drop;
        $p =~ s/(?<=\S)\[\d{1,3}\]//g;                  # footnote markers "cetacean.[1]"
        $p =~ tr/_//d;                                 # _italics_
        push @par, $p;
    }
    next unless @par;
    print "\n" unless $first; $first = 0;
    print "$_\n" for @par;
}
PERL

# Bible: diatheke OSIS, one verse per line -> book name line, [psalm title,] verse text.
cat > "$work/bible.pl" <<'PERL'
use strict; use warnings;
binmode STDIN, ':raw'; binmode STDOUT, ':utf8';
my $book_re = qr/(?:(?:I{1,3}|IV|[1-4]) )?[A-Z][a-z]+(?: (?:of|and|the|[A-Z][a-z]+|\(Greek\)))*/;
my ($book, $verses, $bad) = ('', 0, 0);
while (my $l = <STDIN>) {
    utf8::decode($l) or die "bible.pl: line $. is not UTF-8\n";
    $l =~ s/[\r\n]+\z//;
    next if $l =~ /^\([A-Za-z0-9]+\)$/;                # "(engWEB2015eb)" trailer
    $l =~ s{<milestone[^>]*>}{ }g;
    $l =~ s{<(?!/?note\b)[^>]*>}{}g;                   # all tags but notes
    # drop footnotes; where one sat between two words the module has no space: add one
    $l =~ s{(\S?)(?:<note\b[^>]*>.*?</note>)+(?=(.?))}
           {my ($p, $n) = ($1, $2); $p . (($p ne '' && $n =~ /[\p{L}\p{N}\x{201c}\x{2018}\[(]/) ? ' ' : '')}ge;
    $l =~ s/<[^>]*>//g;
    $l =~ s/&lt;/</g; $l =~ s/&gt;/>/g; $l =~ s/&quot;/"/g; $l =~ s/&apos;/'/g; $l =~ s/&amp;/&/g;
    $l =~ s/[\x00-\x1f\x7f-\x{a0}]/ /g;
    $l =~ s/^ +//;
    my ($head, $bk, $text);
    if ($l =~ /^(?:(.*?) {2,})?($book_re) \d+:\d+: ?(.*)$/) { ($head, $bk, $text) = ($1, $2, $3) }
    else { $bad++; print STDERR "bible.pl: not understood: ", substr($l, 0, 100), "\n" if $ENV{KEEL_CORPUS_DEBUG}; next }
    $text =~ s/ {3,}World English Bible Glossary .*//; # the glossary glued to Rev 22:21
    for ($head, $text) { next unless defined; s/ {2,}/ /g; s/^ //; s/ $//; }
    # psalm titles are sentences; "ALEPH", "Beloved" (speaker labels) are not
    $head = '' unless defined $head && $head =~ / / && $head =~ /\p{Ll}/;
    next if $text eq '' && $head eq '';                # verses absent from this text
    if ($bk ne $book) { print "\n" if $book ne ''; print "$bk\n"; $book = $bk; }
    print "$head\n" if $head ne '';
    next if $text eq '';
    print "$text\n"; $verses++;
}
die "bible.pl: only $verses verses\n" if $verses < 30000;
die "bible.pl: $bad lines not understood\n" if $bad > 10;
PERL

# Fortunes: "%"-separated; keep their lines; drop overstrike, ASCII art and duplicates.
cat > "$work/fortunes.pl" <<'PERL'
use strict; use warnings;
binmode STDOUT, ':utf8';
my (%seen, $n); my $first = 1;
# A few fortunes are UTF-8 that was decoded as Latin-1 and encoded again, once or
# twice ("donâ\x80\x99t"): undo that while the line's chars re-encode to valid UTF-8.
sub unmojibake {
    my $s = shift;
    for (1 .. 3) {
        last unless $s =~ /[\x{80}-\x{ff}]/;
        my $b = $s;
        last unless utf8::downgrade($b, 1) && utf8::decode($b) && $b ne $s;
        $s = $b;
    }
    return $s;
}
for my $f (@ARGV) {
    open my $fh, '<:raw', $f or die "fortunes.pl: $f: $!\n";
    local $/; my $s = <$fh>; close $fh;
    utf8::decode($s);                                  # not UTF-8: keep bytes as Latin-1
    $s =~ s/\r//g;
    $s = join "\n", map { unmojibake($_) } split /\n/, $s, -1;
    for my $q (split /^%[ \t]*\n/m, $s) {
        1 while $q =~ s/[^\x08\n]\x08//g;              # "_\bX", "X\bX": printed as X
        $q =~ s/[\x00-\x09\x0b-\x1f\x7f-\x{a0}]/ /g;   # tabs, bells, C1, NBSP
        my @l = grep { $_ ne '' } map { s/ {2,}/ /gr =~ s/^ //r =~ s/ $//r } split /\n/, $q;
        next unless @l;
        my $body = join "\n", @l;
        my $chars = () = $body =~ /\S/g;
        my $letters = () = $body =~ /\p{L}/g;
        next if $letters < 0.5 * $chars;               # ASCII art, code dumps
        my $key = lc($body =~ s/[^\p{L}\p{N}]+//gr);
        next if $seen{$key}++;
        print "\n" unless $first; $first = 0;
        print "$body\n"; $n++;
    }
}
die "fortunes.pl: only " . ($n // 0) . " fortunes\n" if ($n // 0) < 100;
PERL

# ---- Austen and the novels (R reads the packages' data) ----------------------
cat > "$work/extract.R" <<'RSCRIPT'
a <- commandArgs(TRUE); work <- a[1]; tidytext <- a[2]; tokenizers <- a[3]
put <- function(docs, f) {       # documents separated by a "\f" line; bytes as they are
    con <- file(f, "wb")
    for (i in seq_along(docs)) {
        if (i > 1) writeLines("\f", con, useBytes = TRUE)
        writeLines(enc2utf8(docs[[i]]), con, useBytes = TRUE)
    }
    close(con)
}
austen <- list(janeaustenr::sensesensibility, janeaustenr::prideprejudice,
               janeaustenr::mansfieldpark, janeaustenr::emma,
               janeaustenr::northangerabbey, janeaustenr::persuasion)
load(file.path(tidytext, "extdata", "books.rda"))            # -> books (text, title)
titles <- c("Great Expectations", "The War of the Worlds",
            "Twenty Thousand Leagues under the Sea")          # (its Pride and Prejudice: in Austen)
novels <- lapply(titles, function(t) books$text[books$title == t])
e <- new.env()
lazyLoad(file.path(tokenizers, "data", "Rdata"), envir = e)
novels[[4]] <- unname(e$mobydick)
stopifnot(all(lengths(austen) > 1000), all(lengths(novels) >= 1), nchar(novels[[4]]) > 1e6)
put(austen, file.path(work, "austen.raw"))
put(novels, file.path(work, "novels.raw"))
RSCRIPT
Rscript --vanilla "$work/extract.R" "$work" "$work/pkg/r-cran-tidytext/$rlib/tidytext" \
    "$work/pkg/r-cran-tokenizers/$rlib/tokenizers" > "$work/r.log" 2>&1 \
    || { echo "corpus: ERROR: Rscript failed:" >&2; tail -n 15 "$work/r.log" >&2; exit 1; }
perl "$work/prose.pl" < "$work/austen.raw" > "$work/austen.txt"
perl "$work/prose.pl" < "$work/novels.raw" > "$work/novels.txt"

fdir="$work/pkg/fortunes/usr/share/games/fortunes"
fmin="$work/pkg/fortunes-min/usr/share/games/fortunes"
en=()
for f in "$fmin"/* "$fdir"/*; do
    case ${f##*/} in *.dat|*.u8|ascii-art|zippy) continue ;; esac   # pictures; all-caps nonsense
    [ -f "$f" ] && [ ! -L "$f" ] && en+=("$f")
done
perl "$work/fortunes.pl" "${en[@]}" > "$work/fortunes.txt"
perl "$work/fortunes.pl" "${FORTUNES_DE[@]/#/$work/pkg/fortunes-de/usr/share/games/fortunes/de/}" \
    > "$work/fortunes-de.txt"

if ! wait "$bible_pid"; then
    echo "corpus: ERROR: diatheke failed:" >&2; tail -n 5 "$work/diatheke.log" >&2; exit 1
fi
trap - EXIT
perl "$work/bible.pl" < "$work/web.osis" > "$work/bible-web.txt"

# ---- checks, then publish --------------------------------------------------------
for f in "${FILES[@]}"; do
    [ "$(stat -c %s "$work/$f")" -gt 100000 ] || { echo "corpus: ERROR: $f is too small" >&2; exit 1; }
    # valid UTF-8; no control characters (C0 but newline, C1), no empty first line, no
    # runs of blank lines, no trailing spaces
    perl -ne 'BEGIN { binmode STDIN, ":raw" } utf8::decode($_) or die "line $.: not UTF-8\n";
              /[\x00-\x09\x0b-\x1f\x7f-\x{9f}]/ and die "line $.: control character\n";
              / \n?\z/ and die "line $.: trailing space\n";
              $b = /^\n\z/; die "line $.: blank line misplaced\n" if $b && ($pb || $. == 1); $pb = $b;
              END { die "last line blank\n" if $pb }' "$work/$f" \
        || { echo "corpus: ERROR: $f failed the checks above" >&2; exit 1; }
done
for f in "${FILES[@]}"; do mv -f "$work/$f" "$out/$f"; done
rm -rf "$work"
echo "$stamp" > "$out/.complete"
summary "$out" "${FILES[@]}"
echo "corpus: built in $((SECONDS - t0)) s"
