package storagecluster

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// ConditionNetworkReady says what the operator found of the networks a
// cluster selects.
const ConditionNetworkReady = "NetworkReady"

// NetworkReady reasons (condition and Event). The warnings keep the
// condition True: the network is there and may serve one node, but not a
// cluster of them.
const (
	ReasonHostNetwork   = "HostNetwork"
	ReasonNetworksFound = "NetworkAttachmentsFound"
	// ReasonIPAMNotClusterWide (warning): an IPAM that hands out addresses
	// per node (host-local, static) gives two nodes' holders the same address.
	ReasonIPAMNotClusterWide = "IPAMNotClusterWide"
	// ReasonNoIPAM (warning): the interfaces get no address, no storage
	// traffic flows on them unless something else configures them.
	ReasonNoIPAM = "NoIPAM"
	// ReasonConfigOnNodes (warning): the definition has no config; multus
	// reads a file of its name on each node, which the operator cannot see.
	ReasonConfigOnNodes      = "NetworkConfigOnNodes"
	ReasonNADMissing         = "NetworkAttachmentDefinitionMissing"
	ReasonNADInvalid         = "NetworkAttachmentDefinitionInvalid"
	ReasonMultusNotInstalled = "MultusNotInstalled"
	ReasonNetworkCheckFailed = "NetworkCheckFailed"
)

// DefaultNetworkRecheck is how often a multus cluster's networks are read
// again: the operator watches no NetworkAttachmentDefinition (the CRD may
// come after it), so a definition made or fixed later is seen here.
const DefaultNetworkRecheck = time.Minute

// nadGVK is multus' NetworkAttachmentDefinition, read unstructured: the
// operator needs one string of it, and the CRD may not be installed.
var nadGVK = schema.GroupVersionKind{Group: "k8s.cni.cncf.io", Version: "v1", Kind: "NetworkAttachmentDefinition"}

// +kubebuilder:rbac:groups=k8s.cni.cncf.io,resources=network-attachment-definitions,verbs=get

// cniConfig is the part of a CNI config (one plugin, or a list of them)
// the check reads.
type cniConfig struct {
	Type string `json:"type"`
	IPAM *struct {
		Type string `json:"type"`
	} `json:"ipam"`
	Plugins []cniConfig `json:"plugins"`
}

// ipam returns the main plugin's type and the IPAM type of the first
// plugin that has one ("" when none does).
func (c cniConfig) ipam() (plugin, ipam string) {
	plugin = c.Type
	if c.IPAM != nil {
		ipam = c.IPAM.Type
	}
	for _, p := range c.Plugins {
		if plugin == "" {
			plugin = p.Type
		}
		if ipam == "" && p.IPAM != nil {
			ipam = p.IPAM.Type
		}
	}
	return plugin, ipam
}

// nadFinding is what the check found of one definition: a message, and
// the reason when something is wrong (failed) or worth a warning.
type nadFinding struct {
	reason, message string
	failed          bool
}

// networkCondition checks each NetworkAttachmentDefinition sc selects and
// says what it found; on a change of it, an Event says it too.
func (r *Reconciler) networkCondition(ctx context.Context, sc *v1.StorageCluster) (metav1.Condition, time.Duration) {
	cond := metav1.Condition{Type: ConditionNetworkReady, Status: metav1.ConditionTrue}
	sel := sc.Spec.Network.Selectors
	if sc.Spec.Network.Provider != v1.NetworkProviderMultus || sel == nil {
		cond.Reason, cond.Message = ReasonHostNetwork, "storage traffic uses the nodes' host network"
		return cond, 0
	}
	recheck := r.NetworkRecheck
	if recheck <= 0 {
		recheck = DefaultNetworkRecheck
	}
	var msgs []string
	cond.Reason = ReasonNetworksFound
	warned := false
	for _, n := range []struct{ role, ref string }{{"public", sel.Public}, {"cluster", sel.ClusterNetwork()}} {
		if n.ref == "" || (n.role == "cluster" && n.ref == sel.Public) {
			continue
		}
		f := r.checkNAD(ctx, n.ref)
		msgs = append(msgs, n.role+" "+n.ref+": "+f.message)
		switch {
		case f.failed && cond.Status == metav1.ConditionTrue:
			cond.Status, cond.Reason = metav1.ConditionFalse, f.reason
		case f.reason != "" && !f.failed && !warned && cond.Status == metav1.ConditionTrue:
			cond.Reason, warned = f.reason, true
		}
	}
	if sel.Public == "" {
		msgs = append(msgs, "no public network: client traffic uses the host network, no holder runs")
	}
	cond.Message = strings.Join(msgs, "; ")
	r.conditionEvent(sc, cond, cond.Status != metav1.ConditionTrue || warned)
	return cond, recheck
}

// checkNAD reads one definition ("namespace/name") and its CNI config.
func (r *Reconciler) checkNAD(ctx context.Context, ref string) nadFinding {
	ns, name, _ := strings.Cut(ref, "/")
	nad := &unstructured.Unstructured{}
	nad.SetGroupVersionKind(nadGVK)
	// Unstructured reads go to the API server (the cache holds none).
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, nad)
	switch {
	case meta.IsNoMatchError(err):
		return nadFinding{reason: ReasonMultusNotInstalled, failed: true,
			message: "the NetworkAttachmentDefinition API is not served: install multus and its CRD"}
	case apierrors.IsNotFound(err):
		return nadFinding{reason: ReasonNADMissing, failed: true, message: "NetworkAttachmentDefinition not found"}
	case err != nil:
		return nadFinding{reason: ReasonNetworkCheckFailed, failed: true, message: "reading the NetworkAttachmentDefinition: " + err.Error()}
	}
	config, _, _ := unstructured.NestedString(nad.Object, "spec", "config")
	return configFinding(config)
}

// configFinding says what a definition's spec.config (CNI config JSON)
// means for berth's storage network.
func configFinding(config string) nadFinding {
	if strings.TrimSpace(config) == "" {
		return nadFinding{reason: ReasonConfigOnNodes,
			message: "no spec.config: multus reads a CNI config of this name on each node; make sure every node has the same network with cluster-wide IPAM"}
	}
	var c cniConfig
	if err := json.Unmarshal([]byte(config), &c); err != nil {
		return nadFinding{reason: ReasonNADInvalid, failed: true, message: "spec.config is not a CNI config: " + err.Error()}
	}
	plugin, ipam := c.ipam()
	found := fmt.Sprintf("plugin %s, IPAM %s", cniName(plugin), cniName(ipam))
	switch ipam {
	case "":
		return nadFinding{reason: ReasonNoIPAM, message: fmt.Sprintf("plugin %s, no IPAM: the holders' interfaces get no address", cniName(plugin))}
	case "host-local", "static":
		return nadFinding{reason: ReasonIPAMNotClusterWide,
			message: found + ": it assigns addresses per node, so holders on two nodes can get the same address; use a cluster-wide IPAM (whereabouts, dhcp)"}
	}
	return nadFinding{message: found}
}

// cniNamePattern is what CNI plugin and IPAM types look like.
var cniNamePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// cniName shows a plugin or IPAM type read from a definition in the
// condition's message: as it is when it looks like one, else quoted and
// cut, so that no config makes the message too long for the API (a
// condition message over 32768 bytes keeps the status from being
// written) or breaks its lines.
func cniName(s string) string {
	if s == "" || cniNamePattern.MatchString(s) {
		return s
	}
	if len(s) > 64 {
		s = strings.ToValidUTF8(s[:64], "") + "..."
	}
	return strconv.Quote(s)
}

// conditionEvent records cond as an Event when its reason or message
// differs from the one sc's status holds; warning picks the Event's type.
func (r *Reconciler) conditionEvent(sc *v1.StorageCluster, cond metav1.Condition, warning bool) {
	if prev := meta.FindStatusCondition(sc.Status.Conditions, cond.Type); prev != nil && prev.Reason == cond.Reason && prev.Message == cond.Message {
		return
	}
	typ := corev1.EventTypeNormal
	if warning {
		typ = corev1.EventTypeWarning
	}
	r.event(sc, typ, cond.Reason, cond.Message)
}
