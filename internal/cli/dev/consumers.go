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
// their controllers would only bring them back. Those of them on a node in
// lost (no kubelet answers there to unmount and confirm) are also in
// stranded, in the same form.
func consumers(podsJSON []byte, lost map[string]string) (found, stranded map[string][]string, err error) {
	var list corev1.PodList
	if err := json.Unmarshal(podsJSON, &list); err != nil {
		return nil, nil, fmt.Errorf("pod list: %w", err)
	}
	found, stranded = map[string][]string{}, map[string][]string{}
	for _, p := range list.Items {
		if p.Namespace == Namespace {
			continue
		}
		for _, v := range p.Spec.Volumes {
			if v.PersistentVolumeClaim != nil || v.CSI != nil || v.FlexVolume != nil || v.Ephemeral != nil {
				found[p.Namespace] = append(found[p.Namespace], p.Name)
				if _, ok := lost[p.Spec.NodeName]; ok {
					stranded[p.Namespace] = append(stranded[p.Namespace], p.Name)
				}
				break
			}
		}
	}
	for _, m := range []map[string][]string{found, stranded} {
		for _, names := range m {
			sort.Strings(names)
		}
	}
	return found, stranded, nil
}

// lostNodes lists, as name -> why, the nodes in nodesJSON (a `kubectl get
// nodes -o json` list) that are not Ready: their kubelet does not answer,
// so their pods never finish terminating and their volumes never unmount.
func lostNodes(nodesJSON []byte) (map[string]string, error) {
	var list corev1.NodeList
	if err := json.Unmarshal(nodesJSON, &list); err != nil {
		return nil, fmt.Errorf("node list: %w", err)
	}
	lost := map[string]string{}
	for _, n := range list.Items {
		why := "no Ready condition"
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				why = ""
				if c.Status != corev1.ConditionTrue {
					why = fmt.Sprintf("Ready=%s: %s", c.Status, c.Message)
				}
			}
		}
		if why != "" {
			lost[n.Name] = why
		}
	}
	return lost, nil
}
