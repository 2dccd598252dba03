// Command crewfence-cert-manager runs cert-manager's own controllers (from the pinned
// github.com/cert-manager/cert-manager module, package pkg/controller) against a kubeconfig,
// for the e2e control plane. It is never shipped: tests/e2e/harness/certmanager.py builds it
// lazily and caches it.
//
// cert-manager's cmd/controller module is not served by the Go module proxy, so this main
// does what cmd/controller/app.Run does (controller.NewContextFactory, then every enabled
// constructor from controller.Known(), then the shared informer factories), without leader
// election, metrics/pprof/healthz servers, ACME, Vault, Venafi or Gateway API.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"

	"github.com/cert-manager/cert-manager/pkg/controller"
	logf "github.com/cert-manager/cert-manager/pkg/logs"

	// Register the controllers (each package's init calls controller.Register) and the
	// issuer implementations the issuers controller validates (CA and SelfSigned).
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	_ "github.com/cert-manager/cert-manager/pkg/controller/issuers"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
)

// enabled lists the controllers this binary runs: the Certificate lifecycle, automatic
// approval of CertificateRequests, the CA and SelfSigned signers, and Issuer readiness.
var enabled = sets.New(
	"certificates-issuing",
	"certificates-key-manager",
	"certificates-request-manager",
	"certificates-readiness",
	"certificates-trigger",
	"certificates-revision-manager",
	"certificaterequests-approver",
	"certificaterequests-issuer-ca",
	"certificaterequests-issuer-selfsigned",
	"issuers",
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "path to a kubeconfig")
	workers := flag.Int("workers", 2, "workers per controller")
	ownerRef := flag.Bool("enable-certificate-owner-ref", false,
		"as cert-manager's flag: make each Certificate the owner of the Secret it writes")
	minBackoff := flag.Duration("certificate-request-minimum-backoff-duration", time.Hour,
		"as cert-manager's flag (same default): first wait after a failed issuance")
	maxBackoff := flag.Duration("certificate-request-maximum-backoff-duration", 32*time.Hour,
		"as cert-manager's flag (same default): longest wait after failed issuances")
	klog.InitFlags(flag.CommandLine) // -v and friends, as cert-manager's own binary has them
	flag.Parse()

	logf.InitLogs()
	defer logf.FlushLogs()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx = logf.NewContext(ctx, logf.Log, "controller")
	certs := controller.CertificateOptions{
		EnableOwnerRef:                           *ownerRef,
		CertificateRequestMinimumBackoffDuration: *minBackoff,
		CertificateRequestMaximumBackoffDuration: *maxBackoff,
	}
	if err := run(ctx, *kubeconfig, *workers, certs); err != nil {
		fmt.Fprintf(os.Stderr, "error: %v\n", err)
		logf.FlushLogs()
		os.Exit(1)
	}
}

func run(rootCtx context.Context, kubeconfig string, workers int,
	certs controller.CertificateOptions) error {
	log := logf.FromContext(rootCtx)
	g, rootCtx := errgroup.WithContext(rootCtx)

	factory, err := controller.NewContextFactory(rootCtx, controller.ContextOptions{
		Kubeconfig:         kubeconfig,
		KubernetesAPIQPS:   50,
		KubernetesAPIBurst: 100,
		IssuerOptions:      controller.IssuerOptions{ClusterResourceNamespace: "cert-manager"},
		CertificateOptions: certs,
	})
	if err != nil {
		return err
	}
	base, err := factory.Build()
	if err != nil {
		return err
	}

	names := make([]string, 0, len(enabled))
	for name := range controller.Known() {
		if enabled.Has(name) {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	if missing := enabled.Difference(sets.New(names...)); missing.Len() > 0 {
		return fmt.Errorf("controllers not registered: %v", sets.List(missing))
	}
	log.Info("starting controllers", "controllers", names)
	for _, name := range names {
		iface, err := controller.Known()[name](factory)
		if err != nil {
			return fmt.Errorf("constructing controller %s: %w", name, err)
		}
		g.Go(func() error { return iface.Run(workers, rootCtx) })
	}

	base.SharedInformerFactory.Start(rootCtx.Done())
	base.KubeSharedInformerFactory.Start(rootCtx.Done())
	base.HTTP01ResourceMetadataInformersFactory.Start(rootCtx.Done())

	err = g.Wait()
	base.HTTP01ResourceMetadataInformersFactory.Shutdown()
	base.KubeSharedInformerFactory.Shutdown()
	base.SharedInformerFactory.Shutdown()
	return err
}
