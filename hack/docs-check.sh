#!/usr/bin/env bash
# Checks the links of the documentation: every relative Markdown link in
# README.md and docs/*.md must point to a file or folder that exists, and
# every #anchor to a heading of the target file (GitHub's rules: lowercase,
# punctuation removed, each space a '-', a repeated heading gets -1, -2...;
# only ASCII letters are lowercased).
# Links to other sites (http:, https:, mailto:) are not checked: no network.
# Exits 1 and names each broken link.
#   hack/docs-check.sh [FILE.md...]   default: README.md docs/*.md
set -euo pipefail
cd "$(dirname "$0")/.."
export LC_ALL=C

files=("$@")
if [ ${#files[@]} -eq 0 ]; then
	files=(README.md)
	for f in docs/*.md; do
		[ -e "$f" ] && files+=("$f")
	done
fi

# Prints the anchors of a Markdown file, one a line: its headings' slugs
# (ATX and setext, outside fenced code) and the ids and names of HTML tags.
anchors() {
	awk '
	function slug(t,    s, i, c) {
		sub(/^[ \t]+/, "", t); sub(/[ \t]+$/, "", t)
		# [text](url) and ![alt](url) keep their text; tags go.
		while (match(t, /!?\[[^]]*\]\([^)]*\)/)) {
			s = substr(t, RSTART, RLENGTH)
			sub(/^!?\[/, "", s); sub(/\]\(.*$/, "", s)
			t = substr(t, 1, RSTART - 1) s substr(t, RSTART + RLENGTH)
		}
		gsub(/<[^>]*>/, "", t)
		t = tolower(t)
		# Keep letters, digits, "_", "-", spaces and bytes of non-ASCII
		# characters; every space becomes a "-".
		s = ""
		for (i = 1; i <= length(t); i++) {
			c = substr(t, i, 1)
			if (c ~ /[a-z0-9_-]/ || c > "~") s = s c
			else if (c == " ") s = s "-"
		}
		return s
	}
	function emit(s) {
		if (s in seen) { seen[s]++; print s "-" seen[s] - 1 } else { seen[s] = 1; print s }
	}
	function html(line,    s) {
		while (match(line, /(id|name)="[^"]*"/)) {
			s = substr(line, RSTART, RLENGTH)
			sub(/^[a-z]*="/, "", s); sub(/"$/, "", s)
			print s
			line = substr(line, RSTART + RLENGTH)
		}
	}
	{
		line = $0
		if (fence != "") {
			if (line ~ ("^ ? ? ?" fence "[" substr(fence, 1, 1) "]*[ \t]*$")) fence = ""
			prev = ""
			next
		}
		if (match(line, /^ ? ? ?(```+|~~~+)/)) {
			fence = substr(line, RSTART, RLENGTH); sub(/^ */, "", fence)
			prev = ""
			next
		}
		if (line ~ /^ ? ? ?#+([ \t]|$)/) {
			t = line
			sub(/^ *#+[ \t]*/, "", t)
			sub(/[ \t]+#+[ \t]*$/, "", t); sub(/^#+[ \t]*$/, "", t)
			emit(slug(t))
			prev = ""
			next
		}
		if (prev != "" && prev !~ /^ ? ? ?[|>*+-]/ && (line ~ /^ ? ? ?=+[ \t]*$/ || line ~ /^ ? ? ?-+[ \t]*$/)) {
			emit(slug(prev))
			prev = ""
			next
		}
		if (line ~ /<[a-zA-Z][^>]*(id|name)="/) html(line)
		prev = (line ~ /^[ \t]*$/) ? "" : line
	}' "$1"
}

# Prints "LINE<TAB>TARGET" for every link of a Markdown file outside fenced
# code and code spans: inline links, images and reference definitions.
links() {
	awk '
	{
		line = $0
		if (fence != "") {
			if (line ~ ("^ ? ? ?" fence "[" substr(fence, 1, 1) "]*[ \t]*$")) fence = ""
			next
		}
		if (match(line, /^ ? ? ?(```+|~~~+)/)) {
			fence = substr(line, RSTART, RLENGTH); sub(/^ */, "", fence)
			next
		}
		gsub(/``[^`]*``/, "", line)
		gsub(/`[^`]*`/, "", line)
		if (match(line, /^ ? ? ?\[[^]]+\]:[ \t]*[^ \t]+/)) {
			t = substr(line, RSTART, RLENGTH)
			sub(/^[^]]*\]:[ \t]*/, "", t)
			print NR "\t" t
			next
		}
		while (match(line, /\]\([^)]*\)/)) {
			t = substr(line, RSTART + 2, RLENGTH - 3)
			line = substr(line, RSTART + RLENGTH)
			sub(/^[ \t]+/, "", t)
			if (t ~ /^</) { sub(/^</, "", t); sub(/>.*$/, "", t) } else sub(/[ \t].*$/, "", t)
			print NR "\t" t
		}
	}' "$1"
}

declare -A cache
has_anchor() { # FILE ANCHOR
	if [ -z "${cache[$1]+x}" ]; then
		cache[$1]=$'\n'"$(anchors "$1")"$'\n'
	fi
	[[ ${cache[$1]} == *$'\n'"$2"$'\n'* ]]
}

broken=0
for f in "${files[@]}"; do
	if [ ! -f "$f" ]; then
		echo "docs-check: $f: no such file" >&2
		broken=$((broken + 1))
		continue
	fi
	dir=$(dirname "$f")
	while IFS=$'\t' read -r line target; do
		# Empty, or another site (a scheme, or //host).
		[ -z "$target" ] && continue
		[[ $target == //* || $target =~ ^[a-zA-Z][a-zA-Z0-9+.-]*: ]] && continue
		path=${target%%#*}
		anchor=
		[[ $target == *'#'* ]] && anchor=${target#*#}
		path=${path%%\?*}
		path=${path//%20/ }
		if [ -z "$path" ]; then
			resolved=$f
		elif [[ $path == /* ]]; then
			resolved=.$path
		else
			resolved=$dir/$path
		fi
		if [ ! -e "$resolved" ]; then
			echo "docs-check: $f:$line: $target: $resolved does not exist" >&2
			broken=$((broken + 1))
			continue
		fi
		if [ -n "$anchor" ] && [[ $resolved == *.md ]] && [ -f "$resolved" ] && ! has_anchor "$resolved" "$anchor"; then
			echo "docs-check: $f:$line: $target: no heading #$anchor in $resolved" >&2
			broken=$((broken + 1))
		fi
	done < <(links "$f")
done

if [ $broken -ne 0 ]; then
	echo "docs-check: $broken broken link(s)" >&2
	exit 1
fi
echo "docs-check: ok (${#files[@]} files)"
