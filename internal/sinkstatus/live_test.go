package sinkstatus

import (
	"strings"
	"testing"
	"time"
)

func TestLiveAddReadsOnlyItsSink(t *testing.T) {
	text := `# TYPE pg_sink_applied counter
pg_sink_applied{label="o",path="root.output",sink="copy",stream="a"} 49
pg_sink_applied{label="o",path="root.output",sink="other"} 1000
pg_sink_skipped{label="o",path="root.output",sink="copy"} 3
pg_sink_batches{sink="copy"} 7
pg_sink_failed{sink="copy"} 2
pg_sink_blocked{sink="copy"} 1
pg_sink_errors{class="environment",code="target_missing",sink="copy"} 4
pg_sink_errors{class="transient",code="sink_error",sink="copy"} 1
pg_sink_last_error_timestamp_seconds{sink="copy"} 1.7e+09
output_sent{label="o",path="root.output"} 99
`
	var l Live
	l.add(strings.NewReader(text), "copy")
	if l.Applied != 49 || l.Skipped != 3 || l.Batches != 7 || l.Failed != 2 || l.Blocked != 1 ||
		l.Errors["environment/target_missing"] != 4 || l.Errors["transient/sink_error"] != 1 ||
		l.LastErrorAt == nil || !l.LastErrorAt.Equal(time.Unix(1.7e9, 0)) {
		t.Fatalf("%+v", l)
	}
	if line := l.liveLine(); !strings.Contains(line, "applied 49, skipped 3, failed 2, blocked 1, batches 7; last error 2023-11-14T22:13:20Z") {
		t.Fatalf("line %q", line)
	}
}
