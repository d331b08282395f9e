#!/usr/bin/env bash
# Prints the version of the git tree at DIR (default: this repository),
# from its release tags, vMAJOR.MINOR.PATCH:
#
# (or, in a clone without tags, from the commit that added the newest
# release section of docs/changelog.md, "## v0.1.0 (DATE)"):
#
#   on a release tag, clean     v0.1.0
#   N commits after it          v0.1.1-dev.N+gCOMMIT   (after v0.1.0, before v0.1.1)
#   with uncommitted changes    v0.1.1-dev.N+gCOMMIT.dirty (N may be 0)
#   before any release tag      v0.0.0-dev.N+gCOMMIT
#   not a git tree              v0.0.0-dev
#
# Semantic versioning orders them as written; the count N orders two
# builds between the same releases. --deb prints Debian's form of the
# same (0.1.1~dev.N+gCOMMIT: dpkg sorts ~ before the release), which
# RPM and opkg order alike; --apk Alpine's (0.1.1_preN: apk knows only
# its own suffixes, and _pre sorts before the release; no commit).
#
#   scripts/version.sh [--deb|--apk] [--from VERSION | DIR]
#
# --from gives the version (one this script printed) instead of reading
# git: the other forms of a version already stamped.
set -euo pipefail
form="" from=""
while (($#)); do
	case $1 in
	--deb | --apk) form=${1#--} ;;
	--from) from=$2 && shift ;;
	*) break ;;
	esac
	shift
done
cd "${1:-$(dirname "$0")/..}"
v=v0.0.0-dev
if [[ -n $from ]]; then
	v=$from
elif commit=$(git rev-parse --short=12 HEAD 2>/dev/null); then
	dirty=""
	git diff --quiet HEAD -- 2>/dev/null || dirty=.dirty
	# The release: the newest release tag, or where the clone has none
	# (tags do not travel with every push or clone), the commit that
	# added docs/changelog.md's newest release section.
	tag=$(git describe --tags --abbrev=0 --match 'v[0-9]*' --exclude '*-*' 2>/dev/null) || tag=""
	at=$tag
	# A shallow clone's oldest commit seems to add everything: no
	# release can be told from it.
	if [[ -z $tag && -f docs/changelog.md && $(git rev-parse --is-shallow-repository 2>/dev/null) != true ]]; then
		tag=$(grep -m1 -oE '^## v[0-9]+\.[0-9]+\.[0-9]+ \([0-9]{4}-[0-9]{2}-[0-9]{2}\)$' docs/changelog.md | cut -d' ' -f2) || tag=""
		[[ -z $tag ]] || at=$(git log --format=%H -S "## $tag (" -- docs/changelog.md 2>/dev/null | tail -1)
	fi
	if [[ -n $at && $tag =~ ^v([0-9]+)\.([0-9]+)\.([0-9]+)$ ]]; then
		n=$(git rev-list --count "$at..HEAD")
		if [[ $n == 0 && -z $dirty ]]; then
			v=$tag
		else
			v="v${BASH_REMATCH[1]}.${BASH_REMATCH[2]}.$((BASH_REMATCH[3] + 1))-dev.$n+g$commit$dirty"
		fi
	else
		v="v0.0.0-dev.$(git rev-list --count HEAD)+g$commit$dirty"
	fi
fi
case $form in
deb)
	v=${v#v}
	v=${v/-/\~}
	;;
apk)
	v=${v#v}
	v=${v%%+*}
	v=${v/-dev./_pre}
	v=${v/-dev/_pre0}
	;;
esac
echo "$v"
