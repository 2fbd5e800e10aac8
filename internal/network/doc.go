// Package network keeps storage traffic on a multus network across agent
// restarts (issue 18, after Rook's multus holder/mover design).
//
// A holder pod joins the storage network and does nothing else, so its
// network namespace, and the interface multus put there, outlive any agent
// restart. Two modes let host-network processes (the agent) use it:
//
//   - mover: a privileged host-network process disables the holder's
//     interface and creates a copy of it in the host namespace: a macvlan on
//     the same parent, with the same MAC, addresses and routes. Copies bear a
//     name prefix and an alias that name their holder; only such copies are
//     ever removed.
//   - netns: Do runs an operation (a dial) on a thread that has entered the
//     holder's namespace, moving nothing. The agent starts a ceph volume's
//     blockdev servers in it (the whole process, so librados' threads are
//     there), connects to Ceph from it and mounts NFS shares from it; it
//     finds the namespace with OpenHolder in the cluster's folder under
//     NetnsDir, where that cluster's holders publish their records.
//
// How the mover finds a holder's namespace: each holder writes a Record into
// a hostPath folder shared with the mover (one file per holder pod UID) with
// its interface name, its PID as it sees itself and the identity (device and
// inode) of its network namespace. The mover runs with the host PID
// namespace: it opens /proc/<pid>/ns/net when that PID is in the recorded
// namespace (a holder with host PID), otherwise it looks for any process in
// it under /proc (the pod's sandbox keeps the namespace as long as the pod
// lives, the holder's PID as seen in its own PID namespace means nothing on
// the host). A namespace no process is in is gone, and so is its holder;
// comparing the identity, never a PID alone, keeps a reused PID from
// pointing at another pod. The holder needs no host PID, no mount rights and
// no API access: it stays tiny. The netns mode finds a namespace the same
// way (ProcNamespaces.Handle), so its process needs host PID too.
//
// What a copy carries: the original's addresses (IPv6 link-local ones are
// made by the kernel from the MAC) and its routes, except the kernel's
// prefix routes and default routes (the host keeps its own default route).
// A route the host has already, through another holder's copy on the same
// network, is left to that copy. A copy is made in steps (create down with
// addresses, original down, copy up, routes, alias "copied"); any failure
// removes the copy and restores the original, and a copy a killed mover
// left "copying" is removed by the next one. Going down flushes an
// original's IPv4 routes and IPv6 addresses, so the mover restores an
// original from what it read before (or from the copy, after a restart).
package network
