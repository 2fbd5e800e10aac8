package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/berth-io/berth/internal/cli"
)

func testCommands(got *[]string) []cli.Command {
	mk := func(name string) cli.Command {
		return cli.Command{Name: name, Summary: name + " summary", Main: func(_ context.Context, args []string, _ cli.IO) error {
			*got = append([]string{name}, args...)
			return nil
		}}
	}
	return []cli.Command{mk("agent"), mk("flexvolume"), mk("version")}
}

func TestDispatch(t *testing.T) {
	for _, tc := range []struct {
		argv []string
		want string
	}{
		{[]string{"berth", "agent", "-x"}, "agent -x"},
		{[]string{"/usr/bin/berth", "version"}, "version"},
		{[]string{"/usr/local/bin/agent", "-x"}, "agent -x"},
		{[]string{"berth-agent", "-x"}, "agent -x"},
		{[]string{"/usr/libexec/kubernetes/kubelet-plugins/volume/exec/berth.io~berth/berth", "init"}, "flexvolume init"},
	} {
		var got []string
		var out bytes.Buffer
		if err := run(context.Background(), tc.argv, cli.IO{Stdout: &out, Stderr: &out}, testCommands(&got)); err != nil {
			t.Fatalf("%v: %v", tc.argv, err)
		}
		if s := strings.Join(got, " "); s != tc.want {
			t.Errorf("%v ran %q, want %q", tc.argv, s, tc.want)
		}
	}
}

func TestDispatchErrors(t *testing.T) {
	var got []string
	var out bytes.Buffer
	err := run(context.Background(), []string{"berth", "nope"}, cli.IO{Stdout: &out, Stderr: &out}, testCommands(&got))
	if err == nil || !strings.Contains(err.Error(), `unknown command "nope"`) {
		t.Fatalf("unknown command: err = %v", err)
	}
	if !strings.Contains(out.String(), "agent summary") {
		t.Errorf("usage does not list commands:\n%s", out.String())
	}
	out.Reset()
	if err := run(context.Background(), []string{"berth"}, cli.IO{Stdout: &out, Stderr: &out}, testCommands(&got)); !errors.Is(err, errUsage) {
		t.Errorf("no command: err = %v, want usage error", err)
	}
	if err := run(context.Background(), []string{"berth", "help"}, cli.IO{Stdout: &out, Stderr: &out}, testCommands(&got)); err != nil {
		t.Errorf("help: %v", err)
	}
}
