# shellcheck shell=bash
# fail_digest LOG: for each subtest that failed in LOG (the output of
# `go test -v`), the first line of each of its last 40 log entries. With
# -v a subtest's lines stream while it runs, hundreds of lines above the
# final "--- FAIL"; this puts why it failed next to the result, where a
# CI excerpt around the failure shows it.
fail_digest() {
	awk '
	/^=== (RUN|NAME|CONT) / { cur = $3; next }
	/^ *--- FAIL: / { if (!($3 in failed)) { failed[$3] = 1; order[++nf] = $3 } ; next }
	/^ +[A-Za-z0-9_]+\.go:[0-9]+: / { if (cur != "") { n[cur]++; line[cur, n[cur]] = substr($0, 1, 400) } }
	END {
		for (k = 1; k <= nf; k++) {
			t = order[k]
			if (!(t in n)) continue
			first = n[t] > 40 ? n[t] - 39 : 1
			printf "failed: %s; what it logged (the first line of each of its last %d entries):\n", t, n[t] - first + 1
			for (i = first; i <= n[t]; i++) print line[t, i]
		}
	}' "$1"
}
