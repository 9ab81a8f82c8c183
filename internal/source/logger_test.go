package source

import (
	"fmt"
	"testing"
)

type lineLogger struct{ lines []string }

func (l *lineLogger) Infof(format string, args ...any) {
	l.lines = append(l.lines, "INFO "+fmt.Sprintf(format, args...))
}
func (l *lineLogger) Warnf(format string, args ...any) {
	l.lines = append(l.lines, "WARN "+fmt.Sprintf(format, args...))
}
func (l *lineLogger) Errorf(format string, args ...any) {
	l.lines = append(l.lines, "ERROR "+fmt.Sprintf(format, args...))
}

// Every line a source logs names it once, at the start, whatever the level and arguments.
func TestNamedLoggerPrefixesEveryLine(t *testing.T) {
	for _, tc := range []struct {
		name string
		log  func(Logger)
		want string
	}{
		{"orders", func(l Logger) { l.Infof("took the lease %s", "k") }, "INFO pg_cdc orders: took the lease k"},
		{"orders", func(l Logger) { l.Warnf("lost the lease") }, "WARN pg_cdc orders: lost the lease"},
		{"a%sb", func(l Logger) { l.Errorf("%v (retrying in %s)", "boom", "1s") }, "ERROR pg_cdc a%sb: boom (retrying in 1s)"},
	} {
		rec := &lineLogger{}
		tc.log(newNamedLogger(rec, tc.name))
		if len(rec.lines) != 1 || rec.lines[0] != tc.want {
			t.Errorf("%s: logged %q, want %q", tc.name, rec.lines, tc.want)
		}
	}
}
