package nbd

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// Kernel is the kernel nbd driver, driven over generic netlink.
type Kernel interface {
	// Connect configures a device on socks; Index -1 lets the kernel pick.
	Connect(p ConnectParams) (index int, err error)
	// Reconfigure hands new sockets to a device whose server died; the kernel
	// takes one per dead connection, in order, and drops the rest without an
	// error. What the dead server had read is requeued when its request
	// timer fires (see ConnectParams.Timeout). backend repeats the device's
	// backend identifier: the kernel refuses a reconfigure without it.
	Reconfigure(index int, backend string, socks []*os.File, deadConn time.Duration) error
	// Disconnect tears the device's connections down (NBD_CMD_DISC to the
	// server) and fails queued I/O. The configuration, with its sysfs
	// backend file, goes when the last opener closes the device.
	Disconnect(index int) error
	// Status tells whether the device is configured (the kernel counts any
	// reference to its configuration, an opener's too).
	Status(index int) (connected bool, err error)
}

// ConnectParams configures a new device.
type ConnectParams struct {
	Index int // -1: the kernel picks a free device
	Size  int64
	// BlockSize is the device's logical block size; 0 picks 4096, or 512
	// when Size is not a multiple of 4096. Size must be a multiple of it.
	BlockSize int64
	Socks     []*os.File
	// DeadConnTimeout is how long I/O waits while no connection is alive
	// (a restarted server reconnects meanwhile); then it fails. The device
	// itself stays configured until Disconnect, and a later Reconfigure
	// still revives it.
	DeadConnTimeout time.Duration
	// Timeout is the request timeout. 0 keeps the block layer's 30s timer
	// without a limit: with one connection the kernel only warns and waits
	// (or requeues once the connection was replaced); with several, a
	// request older than the timer marks its connection dead and is
	// requeued on another, either way.
	Timeout time.Duration
	// Backend is shown in /sys/block/nbdN/backend (see BackendID).
	Backend  string
	ReadOnly bool
}

// Generic netlink "nbd" family (include/uapi/linux/nbd-netlink.h).
const (
	familyName  = "nbd"
	genlVersion = 1

	nbdCmdConnect     = 1
	nbdCmdDisconnect  = 2
	nbdCmdReconfigure = 3
	nbdCmdStatus      = 5

	attrIndex           = 1
	attrSizeBytes       = 2
	attrBlockSizeBytes  = 3
	attrTimeout         = 4
	attrServerFlags     = 5
	attrSockets         = 7
	attrDeadConnTimeout = 8
	attrDeviceList      = 9
	attrBackendID       = 10

	sockItem = 1
	sockFD   = 1

	deviceItem      = 1
	deviceIndex     = 1
	deviceConnected = 2
)

const (
	defaultBlockSize = 4096
	minBlockSize     = 512
)

// executor sends one request and returns the replies' generic netlink
// payloads (genlmsghdr + attributes); tests fake it.
type executor func(req *nl.NetlinkRequest) ([][]byte, error)

type netlinkKernel struct {
	family func() (uint16, error)
	exec   executor
}

// NewNetlink is the kernel driver over generic netlink.
func NewNetlink() Kernel {
	return &netlinkKernel{
		family: func() (uint16, error) {
			f, err := netlink.GenlFamilyGet(familyName)
			if err != nil {
				return 0, fmt.Errorf("generic netlink family %q (is the nbd module loaded?): %w", familyName, err)
			}
			return f.ID, nil
		},
		exec: func(req *nl.NetlinkRequest) ([][]byte, error) {
			return req.Execute(unix.NETLINK_GENERIC, 0)
		},
	}
}

// newRequest starts an nbd family message; every command asks for an ACK
// so that commands without a reply still report success or failure.
func newRequest(family uint16, cmd uint8) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(int(family), unix.NLM_F_ACK)
	req.AddData(&nl.Genlmsg{Command: cmd, Version: genlVersion})
	return req
}

func u32(v int) []byte    { return nl.Uint32Attr(uint32(v)) }
func u64(v uint64) []byte { return nl.Uint64Attr(v) }
func secs(d time.Duration) []byte {
	return u64(uint64((d + time.Second - 1) / time.Second)) // round up: 1ms must not become "none"
}

func socketsAttr(socks []*os.File) *nl.RtAttr {
	list := nl.NewRtAttr(unix.NLA_F_NESTED|attrSockets, nil)
	for _, s := range socks {
		item := list.AddRtAttr(unix.NLA_F_NESTED|sockItem, nil)
		item.AddRtAttr(sockFD, u32(int(s.Fd())))
	}
	return list
}

func connectRequest(family uint16, p ConnectParams) (*nl.NetlinkRequest, error) {
	if p.Size <= 0 || len(p.Socks) == 0 {
		return nil, fmt.Errorf("nbd connect: needs a size (%d) and at least one socket", p.Size)
	}
	bs := p.BlockSize
	if bs == 0 {
		bs = defaultBlockSize
		if p.Size%bs != 0 {
			bs = minBlockSize
		}
	}
	if bs < minBlockSize || bs > 65536 || bs&(bs-1) != 0 {
		return nil, fmt.Errorf("nbd connect: block size %d is not a power of two in 512..65536", bs)
	}
	// The kernel takes any byte size but sets the capacity in 512-byte
	// sectors, and a partial last block is read whole: past the end.
	if p.Size%bs != 0 {
		return nil, fmt.Errorf("nbd connect: size %d is not a multiple of the block size %d", p.Size, bs)
	}
	flags := uint64(serverFlags)
	if p.ReadOnly {
		flags |= flagReadOnly
	}
	req := newRequest(family, nbdCmdConnect)
	if p.Index >= 0 {
		req.AddData(nl.NewRtAttr(attrIndex, u32(p.Index)))
	}
	req.AddData(nl.NewRtAttr(attrSizeBytes, u64(uint64(p.Size))))
	req.AddData(nl.NewRtAttr(attrBlockSizeBytes, u64(uint64(bs))))
	req.AddData(nl.NewRtAttr(attrServerFlags, u64(flags)))
	if p.Timeout > 0 {
		req.AddData(nl.NewRtAttr(attrTimeout, secs(p.Timeout)))
	}
	if p.DeadConnTimeout > 0 {
		req.AddData(nl.NewRtAttr(attrDeadConnTimeout, secs(p.DeadConnTimeout)))
	}
	if p.Backend != "" {
		req.AddData(nl.NewRtAttr(attrBackendID, nl.ZeroTerminated(p.Backend)))
	}
	req.AddData(socketsAttr(p.Socks))
	return req, nil
}

func reconfigureRequest(family uint16, index int, socks []*os.File, deadConn time.Duration, backend string) *nl.NetlinkRequest {
	req := newRequest(family, nbdCmdReconfigure)
	req.AddData(nl.NewRtAttr(attrIndex, u32(index)))
	if deadConn > 0 {
		req.AddData(nl.NewRtAttr(attrDeadConnTimeout, secs(deadConn)))
	}
	// A device with a backend identifier refuses a reconfigure without it.
	if backend != "" {
		req.AddData(nl.NewRtAttr(attrBackendID, nl.ZeroTerminated(backend)))
	}
	if len(socks) > 0 {
		req.AddData(socketsAttr(socks))
	}
	return req
}

func indexRequest(family uint16, cmd uint8, index int) *nl.NetlinkRequest {
	req := newRequest(family, cmd)
	req.AddData(nl.NewRtAttr(attrIndex, u32(index)))
	return req
}

// attrsOf parses the attributes of a generic netlink payload.
func attrsOf(msg []byte) ([]syscall.NetlinkRouteAttr, error) {
	if len(msg) < nl.SizeofGenlmsg {
		return nil, fmt.Errorf("short generic netlink message (%d bytes)", len(msg))
	}
	return parseAttrs(msg[nl.SizeofGenlmsg:])
}

// parseAttrs splits netlink attributes. Not nl.ParseRouteAttr: it slices
// past the end (a panic) when the last attribute lacks its padding.
func parseAttrs(b []byte) ([]syscall.NetlinkRouteAttr, error) {
	var attrs []syscall.NetlinkRouteAttr
	for len(b) >= unix.SizeofRtAttr {
		n := int(nl.NativeEndian().Uint16(b[0:2]))
		if n < unix.SizeofRtAttr || n > len(b) {
			return nil, fmt.Errorf("netlink attribute of %d bytes in %d: %w", n, len(b), unix.EINVAL)
		}
		attrs = append(attrs, syscall.NetlinkRouteAttr{
			Attr:  syscall.RtAttr{Len: uint16(n), Type: nl.NativeEndian().Uint16(b[2:4])},
			Value: b[unix.SizeofRtAttr:n:n],
		})
		b = b[min((n+unix.RTA_ALIGNTO-1)&^(unix.RTA_ALIGNTO-1), len(b)):]
	}
	return attrs, nil
}

// attrType drops the nested and byte-order flag bits.
func attrType(a syscall.NetlinkRouteAttr) uint16 {
	return a.Attr.Type &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
}

// parseConnectReply finds NBD_ATTR_INDEX in the connect reply.
func parseConnectReply(msgs [][]byte) (int, error) {
	for _, m := range msgs {
		attrs, err := attrsOf(m)
		if err != nil {
			return 0, err
		}
		for _, a := range attrs {
			if attrType(a) == attrIndex && len(a.Value) >= 4 {
				return int(nl.NativeEndian().Uint32(a.Value)), nil
			}
		}
	}
	return 0, errors.New("nbd connect: reply has no device index")
}

// parseStatusReply finds device index in NBD_ATTR_DEVICE_LIST.
func parseStatusReply(msgs [][]byte, index int) (bool, error) {
	for _, m := range msgs {
		attrs, err := attrsOf(m)
		if err != nil {
			return false, err
		}
		for _, a := range attrs {
			if attrType(a) != attrDeviceList {
				continue
			}
			items, err := parseAttrs(a.Value)
			if err != nil {
				return false, fmt.Errorf("nbd status: device list: %w", err)
			}
			for _, it := range items {
				if attrType(it) != deviceItem {
					continue
				}
				idx, conn, err := parseDeviceItem(it.Value)
				if err != nil {
					return false, err
				}
				if idx == index {
					return conn, nil
				}
			}
		}
	}
	return false, nil
}

func parseDeviceItem(b []byte) (index int, connected bool, err error) {
	fields, err := parseAttrs(b)
	if err != nil {
		return 0, false, fmt.Errorf("nbd status: device item: %w", err)
	}
	index = -1
	for _, f := range fields {
		switch {
		case attrType(f) == deviceIndex && len(f.Value) >= 4:
			index = int(nl.NativeEndian().Uint32(f.Value))
		case attrType(f) == deviceConnected && len(f.Value) >= 1:
			connected = f.Value[0] != 0
		}
	}
	return index, connected, nil
}

func (k *netlinkKernel) run(what string, build func(family uint16) (*nl.NetlinkRequest, error)) ([][]byte, error) {
	fam, err := k.family()
	if err != nil {
		return nil, err
	}
	req, err := build(fam)
	if err != nil {
		return nil, err
	}
	msgs, err := k.exec(req)
	if err != nil {
		return nil, fmt.Errorf("nbd %s: %w", what, err)
	}
	return msgs, nil
}

func (k *netlinkKernel) Connect(p ConnectParams) (int, error) {
	msgs, err := k.run("connect", func(f uint16) (*nl.NetlinkRequest, error) { return connectRequest(f, p) })
	if err != nil {
		return 0, err
	}
	return parseConnectReply(msgs)
}

func (k *netlinkKernel) Reconfigure(index int, backend string, socks []*os.File, deadConn time.Duration) error {
	_, err := k.run(fmt.Sprintf("reconfigure nbd%d", index), func(f uint16) (*nl.NetlinkRequest, error) {
		return reconfigureRequest(f, index, socks, deadConn, backend), nil
	})
	return err
}

func (k *netlinkKernel) Disconnect(index int) error {
	_, err := k.run(fmt.Sprintf("disconnect nbd%d", index), func(f uint16) (*nl.NetlinkRequest, error) {
		return indexRequest(f, nbdCmdDisconnect, index), nil
	})
	return err
}

func (k *netlinkKernel) Status(index int) (bool, error) {
	msgs, err := k.run(fmt.Sprintf("status of nbd%d", index), func(f uint16) (*nl.NetlinkRequest, error) {
		return indexRequest(f, nbdCmdStatus, index), nil
	})
	if err != nil {
		return false, err
	}
	return parseStatusReply(msgs, index)
}
