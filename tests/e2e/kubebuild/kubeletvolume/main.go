// Command kubelet-volume writes one Secret, ConfigMap or projected volume of a Pod into a
// folder with the kubelet's own code, as the kubelet's volume manager does on the node:
// the payload from the secret/configmap plugins' MakePayload (items, defaultMode, mode),
// written by the kubelet's AtomicWriter (timestamped folder, `..data` symlink swap), and
// the fsGroup ownership pass of volume.NewVolumeOwnership with the plugins' read-only
// attributes. Run again on the same folder, it is the kubelet's periodic sync.
//
// The pod and its Secrets and ConfigMaps are read from the API server (the defaults the
// API server filled in included). Projected sources other than secret and configMap are
// refused: they need a kubelet's volume host.
//
//	kubelet-volume --kubeconfig F --namespace NS --pod NAME --volume VOL --dir DIR
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/kubernetes/pkg/volume"
	"k8s.io/kubernetes/pkg/volume/configmap"
	"k8s.io/kubernetes/pkg/volume/secret"
	volumeutil "k8s.io/kubernetes/pkg/volume/util"
)

// readOnlyVolume stands for the secret/configmap/projected mounters in the ownership pass:
// those plugins report ReadOnly, Managed and SELinuxRelabel (their GetAttributes).
type readOnlyVolume struct{ dir string }

func (v readOnlyVolume) GetPath() string                          { return v.dir }
func (v readOnlyVolume) GetMetrics() (*volume.Metrics, error)     { return nil, nil }
func (v readOnlyVolume) SetUp(volume.MounterArgs) error           { return nil }
func (v readOnlyVolume) SetUpAt(string, volume.MounterArgs) error { return nil }
func (v readOnlyVolume) GetAttributes() volume.Attributes {
	return volume.Attributes{ReadOnly: true, Managed: true, SELinuxRelabel: true}
}

type sources struct {
	client    kubernetes.Interface
	namespace string
}

func (s sources) secretPayload(src *v1.SecretProjection, name string, items []v1.KeyToPath,
	optional bool, mode *int32) (map[string]volumeutil.FileProjection, error) {
	obj, err := s.client.CoreV1().Secrets(s.namespace).Get(context.Background(), name, metav1.GetOptions{})
	if errors.IsNotFound(err) && optional {
		obj = &v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: s.namespace, Name: name}}
	} else if err != nil {
		return nil, err
	}
	return secret.MakePayload(items, obj, mode, optional)
}

func (s sources) configMapPayload(name string, items []v1.KeyToPath, optional bool,
	mode *int32) (map[string]volumeutil.FileProjection, error) {
	obj, err := s.client.CoreV1().ConfigMaps(s.namespace).Get(context.Background(), name, metav1.GetOptions{})
	if errors.IsNotFound(err) && optional {
		obj = &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: s.namespace, Name: name}}
	} else if err != nil {
		return nil, err
	}
	return configmap.MakePayload(items, obj, mode, optional)
}

func payload(s sources, vol v1.Volume) (map[string]volumeutil.FileProjection, error) {
	switch {
	case vol.Secret != nil:
		src := vol.Secret
		return s.secretPayload(nil, src.SecretName, src.Items, src.Optional != nil && *src.Optional, src.DefaultMode)
	case vol.ConfigMap != nil:
		src := vol.ConfigMap
		return s.configMapPayload(src.Name, src.Items, src.Optional != nil && *src.Optional, src.DefaultMode)
	case vol.Projected != nil:
		out := map[string]volumeutil.FileProjection{}
		for i, entry := range vol.Projected.Sources {
			var part map[string]volumeutil.FileProjection
			var err error
			switch {
			case entry.Secret != nil:
				part, err = s.secretPayload(entry.Secret, entry.Secret.Name, entry.Secret.Items,
					entry.Secret.Optional != nil && *entry.Secret.Optional, vol.Projected.DefaultMode)
			case entry.ConfigMap != nil:
				part, err = s.configMapPayload(entry.ConfigMap.Name, entry.ConfigMap.Items,
					entry.ConfigMap.Optional != nil && *entry.ConfigMap.Optional, vol.Projected.DefaultMode)
			default:
				return nil, fmt.Errorf("projected source %d: only secret and configMap are supported", i)
			}
			if err != nil {
				return nil, err
			}
			for k, v := range part {
				out[k] = v
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("volume %q is not a secret, configMap or projected volume", vol.Name)
}

func run() error {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file")
	namespace := flag.String("namespace", "", "the pod's namespace")
	podName := flag.String("pod", "", "the pod")
	volumeName := flag.String("volume", "", "the pod's volume to write")
	dir := flag.String("dir", "", "the folder to write it into (created if missing)")
	flag.Parse()
	if *kubeconfig == "" || *namespace == "" || *podName == "" || *volumeName == "" || *dir == "" {
		return fmt.Errorf("all of --kubeconfig --namespace --pod --volume --dir are required")
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	pod, err := client.CoreV1().Pods(*namespace).Get(context.Background(), *podName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	var vol *v1.Volume
	for i := range pod.Spec.Volumes {
		if pod.Spec.Volumes[i].Name == *volumeName {
			vol = &pod.Spec.Volumes[i]
		}
	}
	if vol == nil {
		return fmt.Errorf("pod %s/%s has no volume %q", *namespace, *podName, *volumeName)
	}
	data, err := payload(sources{client: client, namespace: *namespace}, *vol)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*dir, 0o750); err != nil {
		return err
	}
	writer, err := volumeutil.NewAtomicWriter(*dir, fmt.Sprintf("pod %s/%s volume %s", *namespace, *podName, *volumeName))
	if err != nil {
		return err
	}
	var fsGroup *int64
	if pod.Spec.SecurityContext != nil {
		fsGroup = pod.Spec.SecurityContext.FSGroup
	}
	setPerms := func(_ string) error {
		// as the secret and projected plugins' SetUpAt: the whole volume, fsGroupChangePolicy nil
		return volume.NewVolumeOwnership(readOnlyVolume{*dir}, *dir, fsGroup, nil, nil).ChangePermissions()
	}
	return writer.Write(data, setPerms)
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "kubelet-volume:", err)
		os.Exit(1)
	}
}
