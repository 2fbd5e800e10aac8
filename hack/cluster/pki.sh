# Certificates of the e2e cluster, made with openssl (sourced by up.sh).
# Each file is made once; a second up reuses it.

# cert NAME CN ORG USAGE [SAN]: key + certificate signed by the cluster CA.
cert() {
	local name=$1 cn=$2 org=$3 usage=$4 san=${5:-}
	[ -s "$PKI/$name.crt" ] && return 0
	local subj="/CN=$cn"
	[ -n "$org" ] && subj="/O=$org$subj"
	{
		echo "basicConstraints=CA:FALSE"
		echo "keyUsage=critical,digitalSignature,keyEncipherment"
		echo "extendedKeyUsage=$usage"
		[ -n "$san" ] && echo "subjectAltName=$san"
	} >"$PKI/$name.ext"
	openssl req -new -newkey rsa:2048 -nodes -keyout "$PKI/$name.key" -out "$PKI/$name.csr" -subj "$subj" 2>/dev/null
	openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
		-days 3650 -sha256 -extfile "$PKI/$name.ext" -out "$PKI/$name.crt.tmp" 2>/dev/null
	mv "$PKI/$name.crt.tmp" "$PKI/$name.crt"
	rm -f "$PKI/$name.csr" "$PKI/$name.ext"
}

make_pki() {
	umask 077
	if [ ! -s "$PKI/ca.crt" ]; then
		log "certificates in $PKI"
		openssl req -x509 -newkey rsa:2048 -nodes -keyout "$PKI/ca.key" -out "$PKI/ca.crt.tmp" \
			-days 3650 -sha256 -subj "/CN=berth-e2e-ca" -addext "basicConstraints=critical,CA:TRUE" \
			-addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null
		mv "$PKI/ca.crt.tmp" "$PKI/ca.crt"
	fi
	cert apiserver kube-apiserver "" serverAuth \
		"IP:$HUB_IP,IP:127.0.0.1,IP:$SERVICE_IP,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost"
	cert admin berth-e2e-admin system:masters clientAuth
	cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters clientAuth
	cert controller-manager system:kube-controller-manager "" clientAuth
	cert scheduler system:kube-scheduler "" clientAuth
	# One identity per kubelet: NodeRestriction lets each change only its node.
	local i
	for i in $(node_indexes); do
		cert "kubelet-$(node_name "$i")" "system:node:$(node_name "$i")" system:nodes clientAuth
	done
	if [ ! -s "$PKI/sa.pub" ]; then
		openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
		openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
	fi
	umask 022
}
