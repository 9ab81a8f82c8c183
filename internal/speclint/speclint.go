// Package speclint builds the Bloblang lint rules of pgrelay's plugin specs from the same names and
// limits the plugins' validation uses, so `pgrelay lint` refuses what a start would refuse, with
// one wording per kind of rule.
//
// A field rule (Int, Duration, Match, ...) is a whole mapping for ConfigField.LintRule: `this` is
// the field's value. A check (Check) is an expression yielding a message or null, for a
// component-wide rule that combines several fields: Rule joins checks into one mapping for
// ConfigSpec.LintRule (a spec has one).
package speclint

import (
	"fmt"
	"strings"
	"time"

	// The rules use Bloblang methods of Benthos' pure components (parse_duration, parse_url); a
	// spec's rules are parsed when the spec is built, in the plugins' init, so those methods must
	// be registered first.
	_ "github.com/redpanda-data/benthos/v4/public/components/pure"

	"github.com/pgrelay/pgrelay/internal/redisconn"
)

// Int refuses an integer outside [min, max].
func Int(field string, min, max int) string {
	return fmt.Sprintf(`root = if this.type() != "number" || this < %d || this > %d { [%q] }`, min, max, fmt.Sprintf("%s must be between %d and %d", field, min, max))
}

// IntMin refuses an integer below min.
func IntMin(field string, min int) string {
	return fmt.Sprintf(`root = if this.type() != "number" || this < %d { [%q] }`, min, fmt.Sprintf("%s must be at least %d", field, min))
}

// parsedDuration binds $d to the value as a duration in nanoseconds, null when it does not parse
// (Go's syntax: 500ms, 10s, 1h, as the plugins read it).
const parsedDuration = "let d = this.parse_duration().catch(null)\n"

// Duration refuses a duration outside [min, max] and one that does not parse.
func Duration(field string, min, max time.Duration) string {
	return fmt.Sprintf(parsedDuration+`root = if $d == null || $d < %d || $d > %d { [%q] }`,
		min.Nanoseconds(), max.Nanoseconds(), fmt.Sprintf("%s must be a duration between %s and %s", field, min, max))
}

// DurationMin refuses a duration below min and one that does not parse.
func DurationMin(field string, min time.Duration) string {
	return fmt.Sprintf(parsedDuration+`root = if $d == null || $d < %d { [%q] }`,
		min.Nanoseconds(), fmt.Sprintf("%s must be a duration of at least %s", field, min))
}

// DurationAbove refuses a duration at or below min and one that does not parse.
func DurationAbove(field string, min time.Duration) string {
	return fmt.Sprintf(parsedDuration+`root = if $d == null || $d <= %d { [%q] }`,
		min.Nanoseconds(), fmt.Sprintf("%s must be a duration above %s", field, min))
}

// Match refuses a string the regular expression does not match; when optional, "" passes (the
// field's default is derived elsewhere).
func Match(field, pattern string, optional bool) string {
	cond := fmt.Sprintf(`!this.re_match(%s)`, Quote(pattern))
	if optional {
		cond = `this != "" && ` + cond
	}
	return fmt.Sprintf(`root = if %s { [%q] }`, cond, fmt.Sprintf("%s must match %s", field, pattern))
}

// QueueName refuses a queue name that cannot be one: empty, longer than max bytes, or with `{` or
// `}` (its keys' hash tag). For an interpolated field only a value without interpolations is
// checked; one with them is checked per message when it is written.
func QueueName(field string, max int, interpolated bool) string {
	cond := fmt.Sprintf(`this.length() < 1 || this.length() > %d || this.contains("{") || this.contains("}")`, max)
	if interpolated {
		cond = `!this.contains("${!") && (` + cond + `)`
	}
	return fmt.Sprintf(`root = if %s { [%q] }`, cond, fmt.Sprintf("%s must be 1-%d bytes without { or }", field, max))
}

// Rule joins checks into one component-wide lint mapping: every check that yields a message is
// reported.
func Rule(checks ...string) string {
	return "root = [\n  " + strings.Join(checks, ",\n  ") + ",\n].filter(e -> e != null)"
}

// Check is an expression for Rule: msg when cond (a Bloblang boolean over `this`) holds, else null.
func Check(cond, msg string) string {
	return fmt.Sprintf(`if %s { %q }`, cond, msg)
}

// CheckExpr is Check with a message computed by msg, a Bloblang string expression over `this`.
func CheckExpr(cond, msg string) string {
	return fmt.Sprintf(`if %s { %s }`, cond, msg)
}

// Quote makes s a Bloblang string literal.
func Quote(s string) string {
	if !strings.Contains(s, `"""`) {
		return `"""` + s + `"""`
	}
	return fmt.Sprintf("%q", s)
}

// RedisURLChecks are the Checks of the Redis connection fields (redisconn.Fields) under path (""
// at the top level, else e.g. "redis"): url, or every cluster_urls entry when there are some,
// must be a redis://, rediss:// or unix:// URL, the database a number (an absent url is the
// default's, which is).
func RedisURLChecks(path string) []string {
	at := "this"
	if path != "" {
		at += "." + path
	}
	field := func(f string) string {
		if path == "" {
			return f
		}
		return path + "." + f
	}
	okWithDB := func(expr, db string) string {
		return expr + `.parse_url().catch({"scheme": ""}).(u -> u.scheme == "unix" || (["redis", "rediss"].contains(u.scheme) && u.path.or("").re_match("^(/` + db + `)?$")))`
	}
	ok := func(expr string) string { return okWithDB(expr, "[0-9]*") }
	nodeOK := func(expr string) string { return okWithDB(expr, "0?") } // a cluster has database 0 only
	cluster := fmt.Sprintf(`%s.%s.or([])`, at, redisconn.FieldClusterURLs)
	return []string{
		Check(fmt.Sprintf(`%s.length() == 0 && !%s`, cluster, ok(fmt.Sprintf(`%s.%s.or("redis://")`, at, redisconn.FieldURL))),
			field(redisconn.FieldURL)+" must be redis://host:port[/db], rediss://host:port[/db] or unix:///path"),
		Check(fmt.Sprintf(`%s.any(x -> !%s)`, cluster, nodeOK("x")),
			field(redisconn.FieldClusterURLs)+" must list redis://host:port or rediss://host:port URLs, without a database (a cluster has database 0 only)"),
	}
}
