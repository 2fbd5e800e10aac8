package metrics

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	certutil "k8s.io/client-go/util/cert"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// Secure metrics endpoints (--metrics-secure) serve HTTPS, with a
// certificate each process makes for itself, and answer only a request
// whose bearer token the API server accepts (TokenReview) from a user it
// allows `get` on the path, /metrics (SubjectAccessReview): the
// ClusterRole berth-metrics-reader grants it. The agent's endpoint is on
// the node's address (host network), where any pod or host reaches it;
// its metrics name volumes, pods and nodes. A plain endpoint serves anyone
// who connects.

// ServerOptions are the controller-runtime metrics server options of addr,
// secure or plain.
func ServerOptions(addr string, secure bool) metricsserver.Options {
	o := metricsserver.Options{BindAddress: addr}
	if secure {
		o.SecureServing = true
		o.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	return o
}

// SecureHandler is h behind the same checks as a secure controller-runtime
// metrics server, for processes that serve a registry of their own.
func SecureHandler(cfg *rest.Config, log logr.Logger, h http.Handler) (http.Handler, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("metrics authorization: %w", err)
	}
	filter, err := filters.WithAuthenticationAndAuthorization(cfg, hc)
	if err != nil {
		return nil, fmt.Errorf("metrics authorization: %w", err)
	}
	return filter(log, h)
}

// TLSListener serves l over TLS with a self-signed certificate made now, as
// a secure controller-runtime metrics server does: scrapers skip its
// verification and authenticate themselves with their token.
func TLSListener(l net.Listener) (net.Listener, error) {
	cert, key, err := certutil.GenerateSelfSignedCertKeyWithFixtures("localhost", []net.IP{{127, 0, 0, 1}}, nil, "")
	if err != nil {
		return nil, fmt.Errorf("metrics certificate: %w", err)
	}
	pair, err := tls.X509KeyPair(cert, key)
	if err != nil {
		return nil, fmt.Errorf("metrics certificate: %w", err)
	}
	return tls.NewListener(l, &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}), nil
}
