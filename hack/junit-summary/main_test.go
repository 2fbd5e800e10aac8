package main

import (
	"bytes"
	"strings"
	"testing"
)

// A trimmed junit_01.xml as e2e.test v1.34 writes it.
const sample = `<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="5" disabled="1" errors="0" failures="1" time="40">
  <testsuite name="Kubernetes e2e suite" package="/" tests="5" disabled="1" skipped="3" errors="0" failures="1" time="40">
    <testcase name="[sig-storage] CSI Volumes [Driver: berth.io] [Testpattern: Dynamic PV (default fs)] volumes should store data" classname="Kubernetes e2e suite" status="passed" time="20"></testcase>
    <testcase name="[sig-storage] External Storage [Driver: berth.io] [Testpattern: Dynamic PV (default fs)] volumes should store data" classname="Kubernetes e2e suite" status="passed" time="20"></testcase>
    <testcase name="[sig-storage] External Storage [Driver: berth.io] [Testpattern: Dynamic PV (block volmode)] volumes should store data" classname="Kubernetes e2e suite" status="failed" time="300"><failure type="failed">timed out</failure></testcase>
    <testcase name="[sig-storage] External Storage [Driver: berth.io] [Testpattern: Inline-volume (default fs)] volumes should store data" classname="Kubernetes e2e suite" status="skipped" time="0"><skipped message="skipped - Driver &#34;berth.io&#34; does not support volume type &#34;InlineVolume&#34; - skipping"></skipped></testcase>
    <testcase name="[sig-storage] External Storage [Driver: berth.io] [Testpattern: Pre-provisioned PV (default fs)] volumes should store data" classname="Kubernetes e2e suite" status="skipped" time="0"><skipped message="skipped - Driver &#34;berth.io&#34; does not support volume type &#34;InlineVolume&#34; - skipping"></skipped></testcase>
    <testcase name="[sig-storage] External Storage [Driver: berth.io] [Serial] volume-stress" classname="Kubernetes e2e suite" status="skipped" time="0"><skipped message="skipped"></skipped></testcase>
  </testsuite>
</testsuites>`

func TestSummarizeCountsOnlyMatchingSpecs(t *testing.T) {
	s, err := summarize(strings.NewReader(sample), "External Storage")
	if err != nil {
		t.Fatal(err)
	}
	if s.Passed != 1 || len(s.Failed) != 1 || s.skippedCount() != 2 || s.NotSelected != 1 {
		t.Fatalf("summary %+v", s)
	}
	var out bytes.Buffer
	s.print(&out, "berth")
	want := "berth: 1 passed, 1 failed, 2 skipped (1 not selected by focus/skip)\n" +
		"  FAILED [sig-storage] External Storage [Driver: berth.io] [Testpattern: Dynamic PV (block volmode)] volumes should store data\n" +
		"  skipped 2x: Driver \"berth.io\" does not support volume type \"InlineVolume\" - skipping\n"
	if out.String() != want {
		t.Errorf("printed\n%s\nwant\n%s", out.String(), want)
	}
}

func TestSummarizeRefusesBrokenReport(t *testing.T) {
	if _, err := summarize(strings.NewReader("<testsuites><testsuite>"), "x"); err == nil {
		t.Error("a truncated report was read without an error")
	}
}
