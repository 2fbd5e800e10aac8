// Package podcgroup reads which pod a process runs in from its cgroup
// path. It imports nothing of Kubernetes: the blockdev server links it
// (through the network package) and must stay small.
package podcgroup

import (
	"regexp"
	"strings"
)

// kubelet names a pod's cgroup after its UID: "kubepods/burstable/pod<uid>"
// (cgroupfs driver) or "kubepods-burstable-pod<uid_with_underscores>.slice"
// (systemd driver). Inside a cgroup namespace the path may start with
// "/../", which still carries both parts.
var podCgroup = regexp.MustCompile(`kubepods[^\n]*?pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})`)

// PodUID returns the pod UID in a /proc/<pid>/cgroup file, or "".
func PodUID(cgroup string) string {
	m := podCgroup.FindStringSubmatch(cgroup)
	if m == nil {
		return ""
	}
	return strings.ReplaceAll(m[1], "_", "-")
}
