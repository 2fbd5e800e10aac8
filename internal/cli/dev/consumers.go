package dev

import (
	"encoding/json"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
)

// consumers lists, as namespace -> pod names, the pods in podsJSON (a
// `kubectl get pods -A -o json` list) that may hold a berth volume: outside
// berth's namespace, with a claim, a CSI, Flexvolume or generic ephemeral
// volume. Cluster addons (DNS, snapshot-controller) hold none and stay:
// their controllers would only bring them back.
func consumers(podsJSON []byte) (map[string][]string, error) {
	var list corev1.PodList
	if err := json.Unmarshal(podsJSON, &list); err != nil {
		return nil, fmt.Errorf("pod list: %w", err)
	}
	found := map[string][]string{}
	for _, p := range list.Items {
		if p.Namespace == Namespace {
			continue
		}
		for _, v := range p.Spec.Volumes {
			if v.PersistentVolumeClaim != nil || v.CSI != nil || v.FlexVolume != nil || v.Ephemeral != nil {
				found[p.Namespace] = append(found[p.Namespace], p.Name)
				break
			}
		}
	}
	for _, names := range found {
		sort.Strings(names)
	}
	return found, nil
}
