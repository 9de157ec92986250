#!/usr/bin/env bash
# Runs the criterion micro-benchmarks (benches/policy_and_validation.rs) ROUNDS
# times and rewrites the table between <!-- micro:begin --> and <!-- micro:end -->
# in BENCHMARKS.md with the median of the rounds' estimates.
#
# Usage: bash bench/micro.sh
# Environment:
#   ROUNDS            rounds of the whole suite (default 3; the median is reported)
#   BUDGET_SECONDS    wall-clock limit for build and rounds together (default 900)
#   CARGO_TARGET_DIR  defaults to $HOME/.cache/portcullis-target
#
# BENCHMARKS.md is left untouched when the build or any round fails or times out.
# Raw criterion output is kept in a temporary directory whose path is printed.

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

ROUNDS="${ROUNDS:-3}"
BUDGET_SECONDS="${BUDGET_SECONDS:-900}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/portcullis-target}"
RESULTS="$ROOT/BENCHMARKS.md"
BENCH=policy_and_validation

case "$ROUNDS" in '' | *[!0-9]* | 0)
    echo "ROUNDS must be a positive whole number" >&2
    exit 2
    ;;
esac
grep -q '^<!-- micro:begin -->$' "$RESULTS" && grep -q '^<!-- micro:end -->$' "$RESULTS" || {
    echo "$RESULTS lacks the <!-- micro:begin --> / <!-- micro:end --> markers" >&2
    exit 2
}

# Other work on the machine skews every figure: record the load around the rounds.
loadavg() { cut -d ' ' -f 1-3 /proc/loadavg 2>/dev/null || echo unknown; }

deadline=$((SECONDS + BUDGET_SECONDS))
# Seconds left in the budget, in $left; stops the script when none are.
budget() {
    left=$((deadline - SECONDS))
    if ((left <= 0)); then
        echo "time budget of ${BUDGET_SECONDS}s exhausted" >&2
        exit 124
    fi
}

RAW="$(mktemp -d "${TMPDIR:-/tmp}/portcullis-micro.XXXXXX")"
echo "raw output: $RAW" >&2

echo "building the benchmark (target dir $CARGO_TARGET_DIR)" >&2
budget
timeout "$left" cargo bench --bench "$BENCH" --no-run

load_before="$(loadavg)"
for round in $(seq 1 "$ROUNDS"); do
    echo "round $round of $ROUNDS" >&2
    # criterion writes its results to stdout and its progress to stderr.
    budget
    timeout "$left" cargo bench --bench "$BENCH" \
        >"$RAW/round$round.out" 2>"$RAW/round$round.err" || {
        status=$?
        echo "round $round failed (exit $status); see $RAW/round$round.err" >&2
        exit "$status"
    }
done

load_after="$(loadavg)"

# One line per (round, benchmark): round, name, estimate in ns, low in ns, high in ns.
# criterion prints `name time: [low estimate high]`, with the name on the line
# before when it is long.
for round in $(seq 1 "$ROUNDS"); do
    awk -v round="$round" '
        function ns(v, unit) {
            if (unit == "ps") return v / 1000
            if (unit == "ns") return v
            if (unit == "µs" || unit == "us") return v * 1e3
            if (unit == "ms") return v * 1e6
            if (unit == "s") return v * 1e9
            print "unknown unit " unit > "/dev/stderr"; exit 1
        }
        /time:[ \t]+\[/ && !/%/ {
            head = $0; sub(/time:.*/, "", head); gsub(/^[ \t]+|[ \t]+$/, "", head)
            name = (head != "") ? head : prev
            body = $0; sub(/.*time:[ \t]+\[/, "", body); sub(/\].*/, "", body)
            n = split(body, f, /[ \t]+/)
            if (n != 6) { print "cannot read: " $0 > "/dev/stderr"; exit 1 }
            printf "%d\t%s\t%.6f\t%.6f\t%.6f\n", round, name, ns(f[3], f[4]), ns(f[1], f[2]), ns(f[5], f[6])
            next
        }
        # Anything else that is not an outlier report or a verdict may be a name.
        NF && !/outliers among|%\)|:/ { line = $0; gsub(/^[ \t]+|[ \t]+$/, "", line); prev = line }
    ' "$RAW/round$round.out"
done >"$RAW/estimates.tsv"

if [[ ! -s "$RAW/estimates.tsv" ]]; then
    echo "no criterion results found in $RAW" >&2
    exit 1
fi

TABLE="$RAW/table.md"
awk -F '\t' -v rounds="$ROUNDS" '
    function fmt(x) {
        if (x < 1e3) return sprintf("%.1f\tns", x)
        if (x < 1e6) return sprintf("%.2f\tµs", x / 1e3)
        if (x < 1e9) return sprintf("%.2f\tms", x / 1e6)
        return sprintf("%.2f\ts", x / 1e9)
    }
    function sort(a, n,    i, j, t) {
        for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
    }
    function median(a, n) {
        sort(a, n)
        return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    {
        if (!($2 in count)) { order[++names] = $2 }
        count[$2]++
        est[$2, count[$2]] = $3
        byround[$2, $1] = $3
    }
    END {
        print "| Benchmark | Median estimate | Unit | Range over rounds | Ratio to bare `jsonschema`, same round (median) |"
        print "|---|---:|---|---|---:|"
        for (i = 1; i <= names; i++) {
            b = order[i]
            n = count[b]
            delete v
            for (k = 1; k <= n; k++) v[k] = est[b, k]
            m = median(v, n)
            split(fmt(m), mu, "\t")
            split(fmt(v[1]), lo, "\t"); split(fmt(v[n]), hi, "\t")
            range = (n > 1) ? lo[1] " " lo[2] " – " hi[1] " " hi[2] : "one round"
            ratio = ""
            if (b ~ /^validate\//) {
                bare = b; sub(/^validate\//, "jsonschema_bare/", bare)
                if (bare in count) {
                    delete r; rn = 0
                    for (k = 1; k <= rounds; k++)
                        if (((b, k) in byround) && ((bare, k) in byround)) r[++rn] = byround[b, k] / byround[bare, k]
                    if (rn > 0) ratio = sprintf("%.2f×", median(r, rn))
                }
            }
            printf "| `%s` | %s | %s | %s | %s |\n", b, mu[1], mu[2], range, ratio
        }
    }
' "$RAW/estimates.tsv" >"$TABLE"

cpu="$(awk -F ': ' '/^model name/ { print $2; exit }' /proc/cpuinfo 2>/dev/null || true)"
commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [[ -n "$(git status --porcelain -- src benches Cargo.toml Cargo.lock 2>/dev/null)" ]]; then
    commit="$commit, with uncommitted changes to src/, benches/ or Cargo files"
fi

SECTION="$RAW/section.md"
{
    echo '<!-- micro:begin -->'
    echo "Generated by \`bash bench/micro.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC'):"
    echo "$ROUNDS round(s) of the whole suite; each figure is the median of the rounds' criterion"
    echo "estimates (the middle value of criterion's \`time: [low estimate high]\` line)."
    echo
    echo "- machine: $(nproc) CPU(s), ${cpu:-unknown CPU}"
    echo "- $(rustc --version)"
    echo "- commit: $commit"
    echo "- load average (1, 5, 15 min) before the rounds: $load_before; after: $load_after"
    echo
    cat "$TABLE"
    echo '<!-- micro:end -->'
} >"$SECTION"

awk -v section="$SECTION" '
    /^<!-- micro:begin -->$/ { while ((getline line < section) > 0) print line; skip = 1; next }
    /^<!-- micro:end -->$/ { skip = 0; next }
    !skip { print }
' "$RESULTS" >"$RAW/BENCHMARKS.md"
cp "$RAW/BENCHMARKS.md" "$RESULTS"
echo "updated $RESULTS" >&2
cat "$TABLE"
