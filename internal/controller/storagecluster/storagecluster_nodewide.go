package storagecluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/berth-io/berth/api/v1alpha1"
)

// NodeWide is the instance label and name prefix of the objects that
// belong to no StorageCluster: the agent and keeper DaemonSets, the CSI
// controller Deployment, their scrape Services and the CSIDriver. One set
// serves every cluster, so deleting a cluster never removes the keeper
// under mounted volumes. (The names are those the cluster "berth" had when
// each cluster owned its own set: an upgrade adopts them in place.)
const NodeWide = "berth"

// nodeWideRequest is the reconcile request that applies the node-wide set
// only; its name cannot be a StorageCluster's.
var nodeWideRequest = reconcile.Request{NamespacedName: client.ObjectKey{Name: "berth.io/node-wide"}}

// annotationDataDirs on the agent DaemonSet records which cluster each
// served data dir belongs to, so that the data dir of a deleted cluster
// stays mounted while Volumes of it remain (their images are deleted, and
// userspace ones served, from there).
const annotationDataDirs = "berth.io/data-dirs"

// ErrDataDirOverlap: a cluster's data dir lies in or holds another served
// data dir. The agent's mounts of them would overlap and one cluster's
// images would sit inside the other's folder. (Two clusters may share one
// data dir: one mount, and image names never collide.)
var ErrDataDirOverlap = errors.New("data dir overlaps another StorageCluster's")

// nodeWidePlan is what the node-wide set is rendered from.
type nodeWidePlan struct {
	// dirs maps each served data dir's cluster to it.
	dirs map[string]string
	// refused holds, per cluster, why its data dir is not served.
	refused map[string]error
	// nodeTerms place the agent and keeper on the nodes any cluster wants
	// (nil: every node); tolerations are every cluster's.
	nodeTerms   []corev1.NodeSelectorTerm
	tolerations []corev1.Toleration
	// mover: some served cluster's holders are in the mover mode.
	mover bool
	// publicNetworks are the public networks (NADs, "namespace/name",
	// sorted, once each) of the served ceph clusters on multus: the CSI
	// controller joins them to reach those clusters' monitors.
	publicNetworks []string
	// agentResources are the agent container's, merged from the served
	// clusters' spec.agent.resources.
	agentResources corev1.ResourceRequirements
	// controller is the CSI controller's scale, merged from the served
	// clusters' spec.csiController; controllerResources its berth
	// container's, merged from their spec.csiController.resources.
	controller          controllerScale
	controllerResources corev1.ResourceRequirements
	// flexvolume: the agent installs the Flexvolume driver, which any
	// served cluster's spec.agent.flexvolume may ask. unasked: no cluster
	// is served, and the agent keeps what it does (applyNodeWide).
	flexvolume, flexvolumeUnasked bool
}

// dataDirs returns the served data dirs, sorted (a deterministic template).
func (p nodeWidePlan) dataDirs() []string {
	out := make([]string, 0, len(p.dirs))
	for _, d := range p.dirs {
		if !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	slices.Sort(out)
	return out
}

// planNodeWide decides the node-wide set from every StorageCluster, the
// data dirs the agent served so far (kept: cluster -> dir) and the clusters
// that still have Volumes. In a data dir overlap the cluster served
// already wins (a newcomer never takes a served data dir away), then the
// older one.
func planNodeWide(clusters []v1.StorageCluster, kept map[string]string, withVolumes map[string]bool) nodeWidePlan {
	p := nodeWidePlan{dirs: map[string]string{}, refused: map[string]error{}}
	sort.SliceStable(clusters, func(i, j int) bool {
		si := kept[clusters[i].Name] == clusters[i].Spec.DataDir
		sj := kept[clusters[j].Name] == clusters[j].Spec.DataDir
		if si != sj {
			return si
		}
		a, b := clusters[i].CreationTimestamp, clusters[j].CreationTimestamp
		if !a.Equal(&b) {
			return a.Before(&b)
		}
		return clusters[i].Name < clusters[j].Name
	})
	exists := map[string]bool{}
	for i := range clusters {
		exists[clusters[i].Name] = true
	}
	// A gone cluster's data dir stays while its Volumes do; it was served
	// before any cluster made since, so it is taken first.
	gone := false
	for _, name := range sortedKeys(kept) {
		if !exists[name] && withVolumes[name] && v1.ValidateDataDir(kept[name]) == nil {
			p.dirs[name] = kept[name]
			gone = true
		}
	}
	everywhere := len(clusters) == 0
	var served []*v1.StorageCluster
	for i := range clusters {
		sc := &clusters[i]
		if err := v1.ValidateDataDir(sc.Spec.DataDir); err != nil {
			p.refused[sc.Name] = err
			continue
		}
		if err := overlap(p.dirs, sc.Name, sc.Spec.DataDir); err != nil {
			p.refused[sc.Name] = err
			continue
		}
		p.dirs[sc.Name] = sc.Spec.DataDir
		served = append(served, sc)
		if wantsHolder(sc) && sc.Spec.Network.MultusMode() == v1.MultusModeMover {
			p.mover = true
		}
		if pub := sc.Spec.Network.Selectors; wantsHolder(sc) && sc.Spec.Backend == v1.BackendCeph && !slices.Contains(p.publicNetworks, pub.Public) {
			p.publicNetworks = append(p.publicNetworks, pub.Public)
		}
		if len(sc.Spec.Agent.NodeSelector) == 0 {
			everywhere = true
		} else if t := selectorTerm(sc.Spec.Agent.NodeSelector); !slices.ContainsFunc(p.nodeTerms, func(o corev1.NodeSelectorTerm) bool {
			return equality.Semantic.DeepEqual(o, t)
		}) {
			p.nodeTerms = append(p.nodeTerms, t)
		}
		for _, t := range sc.Spec.Agent.Tolerations {
			if !slices.ContainsFunc(p.tolerations, func(o corev1.Toleration) bool { return equality.Semantic.DeepEqual(o, t) }) {
				p.tolerations = append(p.tolerations, t)
			}
		}
	}
	if everywhere {
		p.nodeTerms = nil
	}
	slices.Sort(p.publicNetworks)
	asks := served
	if gone {
		// The agent still serves a gone cluster's volumes, and its spec
		// (its ask) went with it: it asks the defaults, so that the other
		// clusters' smaller asks do not starve those volumes' servers.
		asks = append(slices.Clip(served), &v1.StorageCluster{})
	}
	p.agentResources = agentResources(asks)
	p.controller = controllerScaleOf(asks)
	p.controllerResources = csiControllerResources(asks)
	// Not asks: a gone cluster asks no Flexvolume driver, which would roll
	// the agent onto a plugin folder that nodes with a read-only /usr
	// cannot make, while its volumes still wait to be cleaned.
	p.flexvolumeUnasked = len(served) == 0
	p.flexvolume = p.flexvolumeUnasked || slices.ContainsFunc(served, func(sc *v1.StorageCluster) bool { return sc.Spec.Agent.FlexvolumeEnabled() })
	return p
}

// overlap refuses dir when it lies in or holds a served data dir of
// another cluster.
func overlap(served map[string]string, cluster, dir string) error {
	for _, other := range sortedKeys(served) {
		od := served[other]
		if other == cluster {
			continue
		}
		if strings.HasPrefix(dir, od+"/") || strings.HasPrefix(od, dir+"/") {
			return fmt.Errorf("%w: %s and StorageCluster %s's %s (the agent mounts every cluster's data dir; give each its own folder)",
				ErrDataDirOverlap, dir, other, od)
		}
	}
	return nil
}

func selectorTerm(sel map[string]string) corev1.NodeSelectorTerm {
	var t corev1.NodeSelectorTerm
	for _, k := range sortedKeys(sel) {
		t.MatchExpressions = append(t.MatchExpressions, corev1.NodeSelectorRequirement{
			Key: k, Operator: corev1.NodeSelectorOpIn, Values: []string{sel[k]},
		})
	}
	return t
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// applyNodeWide brings the node-wide set to what every StorageCluster
// asks. It runs at start and on every reconcile (a cluster made, changed
// or gone changes the data dirs and placement); an unchanged set sends no
// update.
func (r *Reconciler) applyNodeWide(ctx context.Context) (observed, nodeWidePlan, error) {
	r.nodeWideMu.Lock()
	defer r.nodeWideMu.Unlock()
	obs := observed{
		agent:      &appsv1.DaemonSet{ObjectMeta: r.meta(componentAgent)},
		keeper:     &appsv1.DaemonSet{ObjectMeta: r.meta(componentKeeper)},
		controller: &appsv1.Deployment{ObjectMeta: r.meta(componentController)},
		mover:      &appsv1.DaemonSet{ObjectMeta: r.meta(componentMover)},
	}
	var list v1.StorageClusterList
	if err := r.Client.List(ctx, &list); err != nil {
		return obs, nodeWidePlan{}, fmt.Errorf("list StorageClusters: %w", err)
	}
	kept := map[string]string{}
	if err := r.Client.Get(ctx, client.ObjectKeyFromObject(obs.agent), obs.agent); err != nil && !apierrors.IsNotFound(err) {
		return obs, nodeWidePlan{}, fmt.Errorf("agent DaemonSet: %w", err)
	}
	if a := obs.agent.Annotations[annotationDataDirs]; a != "" {
		if err := json.Unmarshal([]byte(a), &kept); err != nil {
			r.Log.Error(err, "ignoring the agent DaemonSet's data dir record", "annotation", annotationDataDirs)
		}
	}
	withVolumes := map[string]bool{}
	if len(kept) > 0 {
		var vols v1.VolumeList
		if err := r.Client.List(ctx, &vols); err != nil {
			return obs, nodeWidePlan{}, fmt.Errorf("list Volumes: %w", err)
		}
		for i := range vols.Items {
			withVolumes[vols.Items[i].Spec.StorageCluster] = true
		}
	}
	plan := planNodeWide(list.Items, kept, withVolumes)
	if plan.flexvolumeUnasked && obs.agent.ResourceVersion != "" {
		plan.flexvolume = installsFlexvolume(obs.agent)
	}

	var errs []error
	errs = append(errs, r.ensureNodeWideChanged(ctx, obs.agent, func() bool {
		return resourcesChanged(&obs.agent.Spec.Template, func() { r.agentDaemonSet(plan, obs.agent) })
	}))
	errs = append(errs, r.ensureNodeWideChanged(ctx, obs.keeper, func() bool {
		return resourcesChanged(&obs.keeper.Spec.Template, func() { r.keeperDaemonSet(plan, obs.keeper) })
	}))
	// A controller that leaves its last storage network loses the
	// annotation, or its container a limit: a removal.
	errs = append(errs, r.ensureNodeWideChanged(ctx, obs.controller, func() bool {
		was := obs.controller.Spec.Template.Annotations[AnnotationNetworks]
		changed := resourcesChanged(&obs.controller.Spec.Template, func() { r.controllerDeployment(plan, obs.controller) })
		return changed || was != obs.controller.Spec.Template.Annotations[AnnotationNetworks]
	}))
	errs = append(errs, r.applyControllerBudget(ctx, plan))
	errs = append(errs, r.applyMover(ctx, plan, obs.mover))
	for _, component := range []string{componentAgent, componentController} {
		port := int32(AgentMetricsPort)
		if component == componentController {
			port = ControllerMetricsPort
		}
		svc := &corev1.Service{ObjectMeta: r.metricsServiceMeta(component)}
		errs = append(errs, r.ensureNodeWide(ctx, svc, func() { r.metricsService(component, port, svc) }))
	}
	drv := &storagev1.CSIDriver{}
	drv.Name = v1.DriverName
	errs = append(errs, r.ensureNodeWide(ctx, drv, func() { csiDriver(drv) }))
	return obs, plan, errors.Join(errs...)
}

// ensureNodeWide creates obj or brings it to what mutate sets, owned by no
// StorageCluster: an owner reference to one, left from when each cluster
// had its own set, is dropped so that deleting that cluster keeps it.
func (r *Reconciler) ensureNodeWide(ctx context.Context, obj client.Object, mutate func()) error {
	return r.ensureNodeWideChanged(ctx, obj, func() bool { mutate(); return false })
}

// ensureNodeWideChanged is ensureNodeWide with a mutate that says whether
// it removed something: createOrUpdate keeps an object whose read fields
// merely lack what was rendered, so a removal must say it changed.
func (r *Reconciler) ensureNodeWideChanged(ctx context.Context, obj client.Object, mutate func() bool) error {
	return r.createOrUpdate(ctx, obj, func() (bool, error) {
		changed := mutate()
		refs := obj.GetOwnerReferences()
		kept := slices.DeleteFunc(slices.Clone(refs), func(o metav1.OwnerReference) bool {
			gv, err := schema.ParseGroupVersion(o.APIVersion)
			return err == nil && gv.Group == v1.GroupVersion.Group && o.Kind == "StorageCluster"
		})
		if len(kept) == len(refs) {
			return changed, nil
		}
		obj.SetOwnerReferences(kept)
		return true, nil
	})
}

// removeNodeWide deletes obj, read by its name, when berth made it (an
// object of that name someone else made stays). Once it is gone, obj has
// no ResourceVersion.
func (r *Reconciler) removeNodeWide(ctx context.Context, obj client.Object) error {
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj)
	if apierrors.IsNotFound(err) {
		obj.SetResourceVersion("")
		return nil
	}
	if err != nil {
		return fmt.Errorf("%T %s: %w", obj, obj.GetName(), err)
	}
	if obj.GetLabels()[labelManagedBy] != managedBy {
		return nil
	}
	err = r.deleteExact(ctx, obj)
	obj.SetResourceVersion("")
	return err
}

// startNodeWide applies the node-wide set when the operator starts, before
// (or without) any StorageCluster: the agent and keeper are there for the
// first cluster. A failure is retried by the next reconcile.
func (r *Reconciler) startNodeWide(ctx context.Context) error {
	if _, _, err := r.applyNodeWide(ctx); err != nil {
		r.Log.Error(err, "applying the node-wide agent, keeper and CSI controller at start")
	}
	return nil
}

// nodeWideEvents maps a change of a node-wide object to the node-wide set
// and to every cluster (their status reports its readiness).
func (r *Reconciler) nodeWideEvents(ctx context.Context, o client.Object) []reconcile.Request {
	if o.GetLabels()[labelInstance] != NodeWide || o.GetLabels()[labelManagedBy] != managedBy {
		return nil
	}
	return append(r.allClusters(ctx, o), nodeWideRequest)
}

// agentDataDirs returns the data dir mounts of the agent, one per
// served data dir.
func agentDataDirs(plan nodeWidePlan) ([]corev1.VolumeMount, []corev1.Volume) {
	var mounts []corev1.VolumeMount
	var vols []corev1.Volume
	for i, d := range plan.dataDirs() {
		name := fmt.Sprintf("data-dir-%d", i)
		// HostToContainer: a data dir that is a mount point made after the
		// pod started is still seen.
		mounts = append(mounts, corev1.VolumeMount{Name: name, MountPath: d, MountPropagation: ptr.To(corev1.MountPropagationHostToContainer)})
		vols = append(vols, hostPathVolume(name, d, corev1.HostPathDirectoryOrCreate))
	}
	return mounts, vols
}

// dataDirsAnnotation records plan's served data dirs on the agent DaemonSet.
func dataDirsAnnotation(plan nodeWidePlan) string {
	b, _ := json.Marshal(plan.dirs) // a map of strings always marshals
	return string(b)
}

// placement returns the agent's and keeper's node affinity.
func placement(plan nodeWidePlan) *corev1.Affinity {
	if len(plan.nodeTerms) == 0 {
		return nil
	}
	return &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: plan.nodeTerms},
	}}
}
