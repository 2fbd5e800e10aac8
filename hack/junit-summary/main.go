// Command junit-summary prints the outcome of one Kubernetes e2e run from
// its JUnit report (the e2e.test -report-dir file junit_01.xml):
//
//	junit-summary [-class NAME] [-match TEXT] REPORT.xml
//
// It counts the specs whose name contains -match (default "External
// Storage"): passed, failed, skipped by the suite while running (a
// capability the driver does not claim, a cluster too small, ...) with
// each distinct reason, and those that focus/skip left out. Exit 1 when a
// spec failed or none ran.
package main

import (
	"encoding/xml"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

func main() {
	class := flag.String("class", "", "name printed in front of the counts (e.g. the StorageClass)")
	match := flag.String("match", "External Storage", "count only specs whose name contains this")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: junit-summary [-class NAME] [-match TEXT] REPORT.xml")
		os.Exit(2)
	}
	f, err := os.Open(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, "junit-summary:", err)
		os.Exit(1)
	}
	defer f.Close()
	s, err := summarize(f, *match)
	if err != nil {
		fmt.Fprintln(os.Stderr, "junit-summary:", err)
		os.Exit(1)
	}
	s.print(os.Stdout, *class)
	if len(s.Failed) > 0 || s.Passed == 0 {
		os.Exit(1)
	}
}

type testCase struct {
	Name    string `xml:"name,attr"`
	Status  string `xml:"status,attr"`
	Skipped *struct {
		Message string `xml:"message,attr"`
	} `xml:"skipped"`
	Failure *struct{} `xml:"failure"`
	Error   *struct{} `xml:"error"`
}

type report struct {
	Suites []struct {
		Cases []testCase `xml:"testcase"`
	} `xml:"testsuite"`
}

// summary is what one run did with the matching specs.
type summary struct {
	Passed      int
	Failed      []string
	Skipped     map[string][]string // reason -> spec names
	NotSelected int
}

// filteredMessage is Ginkgo's skip message of a spec that focus or skip
// left out; a spec that skipped itself says "skipped - <reason>".
const filteredMessage = "skipped"

func summarize(r io.Reader, match string) (summary, error) {
	var rep report
	if err := xml.NewDecoder(r).Decode(&rep); err != nil {
		return summary{}, fmt.Errorf("read JUnit report: %w", err)
	}
	s := summary{Skipped: map[string][]string{}}
	for _, suite := range rep.Suites {
		for _, c := range suite.Cases {
			if !strings.Contains(c.Name, match) {
				continue
			}
			switch {
			case c.Failure != nil || c.Error != nil:
				s.Failed = append(s.Failed, c.Name)
			case c.Skipped != nil && c.Skipped.Message == filteredMessage:
				s.NotSelected++
			case c.Skipped != nil:
				reason := strings.TrimPrefix(c.Skipped.Message, filteredMessage+" - ")
				s.Skipped[reason] = append(s.Skipped[reason], c.Name)
			case c.Status == "passed":
				s.Passed++
			default:
				// pending or an unknown state: not a pass
				s.Failed = append(s.Failed, c.Name+" ("+c.Status+")")
			}
		}
	}
	return s, nil
}

func (s summary) skippedCount() int {
	n := 0
	for _, names := range s.Skipped {
		n += len(names)
	}
	return n
}

func (s summary) print(w io.Writer, class string) {
	prefix := ""
	if class != "" {
		prefix = class + ": "
	}
	fmt.Fprintf(w, "%s%d passed, %d failed, %d skipped (%d not selected by focus/skip)\n",
		prefix, s.Passed, len(s.Failed), s.skippedCount(), s.NotSelected)
	for _, name := range s.Failed {
		fmt.Fprintf(w, "  FAILED %s\n", name)
	}
	reasons := make([]string, 0, len(s.Skipped))
	for r := range s.Skipped {
		reasons = append(reasons, r)
	}
	sort.Strings(reasons)
	for _, r := range reasons {
		fmt.Fprintf(w, "  skipped %dx: %s\n", len(s.Skipped[r]), r)
	}
}
