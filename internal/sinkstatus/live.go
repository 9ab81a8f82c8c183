package sinkstatus

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Live are a running sink's counters since its process started, scraped from the pipeline's
// Prometheus endpoint (the durable state is in the progress rows; these add what only the process
// knows: redeliveries skipped, batches, errors).
type Live struct {
	URL         string           `json:"url"`
	Applied     int64            `json:"applied"`
	Skipped     int64            `json:"skipped"`
	Failed      int64            `json:"failed"`
	Blocked     int64            `json:"blocked"`
	Batches     int64            `json:"batches"`
	Errors      map[string]int64 `json:"errors,omitempty"` // "class/code" → count
	LastErrorAt *time.Time       `json:"last_error_at,omitempty"`
	Problem     string           `json:"scrape_error,omitempty"`
}

// promLine is one sample of the Prometheus text format: name{labels} value.
var promLine = regexp.MustCompile(`^(pg_sink_[a-z_]+)\{([^}]*)\} (\S+)$`)
var promLabel = regexp.MustCompile(`(\w+)="((?:[^"\\]|\\.)*)"`)

// scrapeLive reads the pg_sink_* samples of sink name from url.
func scrapeLive(ctx context.Context, url, name string) *Live {
	live := &Live{URL: url}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil { // its text quotes the URL, password included
		live.URL, live.Problem = "", "the metrics URL does not parse"
		return live
	}
	live.URL = req.URL.Redacted() // a password in the URL never shows
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		live.Problem = fmt.Sprintf("cannot read the metrics (is the pipeline running?): %v", err)
		return live
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		live.Problem = "metrics endpoint answered " + resp.Status
		return live
	}
	live.add(resp.Body, name)
	return live
}

// add sums the samples of sink name found in the exposition text r.
func (l *Live) add(r io.Reader, name string) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		m := promLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		labels := map[string]string{}
		for _, lm := range promLabel.FindAllStringSubmatch(m[2], -1) {
			labels[lm[1]] = lm[2]
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if labels["sink"] != name || err != nil || math.IsNaN(v) {
			continue
		}
		n := int64(v)
		switch m[1] {
		case "pg_sink_applied":
			l.Applied += n
		case "pg_sink_skipped":
			l.Skipped += n
		case "pg_sink_failed":
			l.Failed += n
		case "pg_sink_blocked":
			l.Blocked += n
		case "pg_sink_batches":
			l.Batches += n
		case "pg_sink_errors":
			if l.Errors == nil {
				l.Errors = map[string]int64{}
			}
			l.Errors[labels["class"]+"/"+labels["code"]] += n
		case "pg_sink_last_error_timestamp_seconds":
			if v > 0 {
				at := time.Unix(0, int64(v*1e9)).UTC()
				if l.LastErrorAt == nil || at.After(*l.LastErrorAt) {
					l.LastErrorAt = &at
				}
			}
		}
	}
}

// liveLine is the text form of l.
func (l *Live) liveLine() string {
	if l.Problem != "" {
		return fmt.Sprintf("live: %s: %s", l.URL, l.Problem)
	}
	s := fmt.Sprintf("live (since the process started, %s): applied %d, skipped %d, failed %d, blocked %d, batches %d",
		l.URL, l.Applied, l.Skipped, l.Failed, l.Blocked, l.Batches)
	if l.LastErrorAt != nil {
		var errs []string
		for k, n := range l.Errors {
			errs = append(errs, fmt.Sprintf("%s ×%d", k, n))
		}
		s += fmt.Sprintf("; last error %s (%s)", l.LastErrorAt.Format(time.RFC3339), strings.Join(errs, ", "))
	}
	return s
}
