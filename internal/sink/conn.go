package sink

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgrelay/pgrelay/internal/errcode"
)

// ConnConfig is how the sink reaches PostgreSQL: a DSN (URL or key=value) and/or separate fields,
// the fields overriding what the DSN says, and TLS as libpq's sslmode.
type ConnConfig struct {
	DSN                           string
	Host                          string
	Port                          int
	User, Password, Database      string
	TLSMode                       string // "" (libpq default: prefer), disable, prefer, require, verify-ca, verify-full
	RootCAFile, CertFile, KeyFile string
	MaxConns                      int // pool size; at least max_in_flight + 1
	ApplicationName               string
}

// sessionSettings are the settings every pgrelay session runs with (DESIGN §2), so text values such
// as timestamps and dates are read the same way everywhere.
var sessionSettings = map[string]string{"timezone": "UTC", "datestyle": "ISO, MDY", "intervalstyle": "postgres",
	"extra_float_digits": "3", "bytea_output": "hex"}

// Pool opens a connection pool (it connects lazily; the first query reports a bad address).
func (c ConnConfig) Pool(ctx context.Context) (*pgxpool.Pool, error) {
	switch c.TLSMode {
	case "", "disable", "allow", "prefer", "require", "verify-ca", "verify-full":
	default:
		return nil, errcode.New("sink_config", fmt.Sprintf("tls.mode %q is unknown", c.TLSMode),
			"use disable, prefer, require, verify-ca or verify-full")
	}
	var kv []string
	add := func(k, v string) {
		if v != "" {
			kv = append(kv, k+"='"+strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v)+"'")
		}
	}
	add("host", c.Host)
	if c.Port > 0 {
		add("port", fmt.Sprint(c.Port))
	}
	add("user", c.User)
	add("password", c.Password)
	add("dbname", c.Database)
	add("sslmode", c.TLSMode)
	add("sslrootcert", c.RootCAFile)
	add("sslcert", c.CertFile)
	add("sslkey", c.KeyFile)
	dsn := strings.Join(kv, " ")
	if c.DSN != "" {
		dsn = joinDSN(c.DSN, kv)
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, errcode.New("sink_config", "cannot parse the connection settings: "+redact(err.Error(), c.Password),
			"write dsn as postgres://user@host:port/db or as key=value pairs")
	}
	if c.MaxConns > 0 {
		cfg.MaxConns = int32(c.MaxConns)
	}
	cfg.MaxConnIdleTime = time.Minute
	rp := cfg.ConnConfig.RuntimeParams
	for k, v := range sessionSettings {
		rp[k] = v
	}
	if c.ApplicationName != "" {
		rp["application_name"] = c.ApplicationName
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

// joinDSN adds key=value settings to a DSN; for a URL they become query parameters.
func joinDSN(dsn string, kv []string) string {
	if len(kv) == 0 {
		return dsn
	}
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		// A URL cannot mix with key=value pairs: carry the fields as query parameters.
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		var q []string
		for _, p := range kv {
			k, v, _ := strings.Cut(p, "=")
			v = strings.NewReplacer(`\'`, `'`, `\\`, `\`).Replace(strings.Trim(v, "'"))
			q = append(q, k+"="+urlEscape(v))
		}
		return dsn + sep + strings.Join(q, "&")
	}
	return dsn + " " + strings.Join(kv, " ")
}

func urlEscape(s string) string {
	var b strings.Builder
	for _, r := range []byte(s) {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.IndexByte("-._~/", r) >= 0 {
			b.WriteByte(r)
		} else {
			fmt.Fprintf(&b, "%%%02X", r)
		}
	}
	return b.String()
}

func redact(s, password string) string {
	if password == "" {
		return s
	}
	return strings.ReplaceAll(s, password, "xxxxx")
}
