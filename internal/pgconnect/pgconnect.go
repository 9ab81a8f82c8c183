// Package pgconnect is how every pgrelay component reaches PostgreSQL: the connection fields shared
// by the pg_cdc input and the pg_sink output (dsn, host, port, user, password, database, tls), their
// parsing and checks, and the pgx configurations built from them, always with the session settings
// of DESIGN §2 so values print the same everywhere.
package pgconnect

import (
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/pgrelay/pgrelay/internal/confread"
	"github.com/pgrelay/pgrelay/internal/convert"
	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/rawio"
	"github.com/pgrelay/pgrelay/internal/speclint"
)

// Config is a parsed PostgreSQL connection: a DSN and/or separate fields; a field that is set
// overrides what the DSN says.
type Config struct {
	DSN                           string // URL or key=value
	Host                          string
	Port                          int
	User, Password, Database      string
	TLSMode                       string // "" (the DSN's, else libpq's prefer), disable, allow, prefer, require, verify-ca, verify-full
	RootCAFile, CertFile, KeyFile string
	ConnectTimeout                time.Duration
	ApplicationName               string
}

// TLSModes are the accepted tls.mode values (libpq's sslmode).
var TLSModes = []string{"", "disable", "allow", "prefer", "require", "verify-ca", "verify-full"}

// Field names of the connection fields.
const (
	FieldDSN           = "dsn"
	FieldHost          = "host"
	FieldPort          = "port"
	FieldUser          = "user"
	FieldPassword      = "password"
	FieldDatabase      = "database"
	FieldTLS           = "tls"
	FieldTLSMode       = "mode"
	FieldTLSRootCAFile = "root_ca_file"
	FieldTLSClientCert = "client_cert_file"
	FieldTLSClientKey  = "client_key_file"
	MaxPort            = 65535
	tlsModeVerifyCA    = "verify-ca"
	tlsModeVerifyFull  = "verify-full"
	msgRootCANeedsMode = FieldTLS + "." + FieldTLSRootCAFile + ": needs " + FieldTLS + "." + FieldTLSMode + " " + tlsModeVerifyCA + " or " + tlsModeVerifyFull
	msgCertAndKey      = FieldTLS + "." + FieldTLSClientCert + ": " + FieldTLSClientCert + " and " + FieldTLSClientKey + " go together"
	msgDSNOrHost       = FieldDSN + ": set " + FieldDSN + " or " + FieldHost
	dsnURLPrefix       = "postgres://"
	dsnURLPrefixLong   = "postgresql://"
	dsnKeyValuePattern = `^\s*([A-Za-z_]+\s*=\s*('([^'\\]|\\.)*'|[^\s']+)\s*)*$`
)

// Fields returns the connection fields, to put at the top level of a component's spec.
func Fields() []*service.ConfigField {
	return []*service.ConfigField{
		service.NewStringField(FieldDSN).
			Description("PostgreSQL connection string (URL or key=value). The fields host, port, user, password, database and tls override its parts. Put passwords in `${ENV}` variables.").
			Example("postgres://pgrelay:${PGPASSWORD}@127.0.0.1:5432/app").Default("").Secret().
			LintRule(fmt.Sprintf("let bad = if this == \"\" { false } else if this.has_prefix(%q) || this.has_prefix(%q) { this.parse_url().catch(null) == null } else { !this.re_match(%s) }\nroot = if $bad { [%q] }",
				dsnURLPrefix, dsnURLPrefixLong, speclint.Quote(dsnKeyValuePattern), FieldDSN+" must be a postgres:// URL or key=value pairs")),
		service.NewStringField(FieldHost).Description("Host name or socket directory (when no dsn, or to override it).").Default(""),
		service.NewIntField(FieldPort).Description("Port; 0 keeps the dsn's (or 5432).").Default(0).
			LintRule(speclint.Int(FieldPort, 0, MaxPort)),
		service.NewStringField(FieldUser).Description("User name.").Default(""),
		service.NewStringField(FieldPassword).Description("Password. Use `${ENV}`.").Default("").Secret(),
		service.NewStringField(FieldDatabase).Description("Database name.").Default(""),
		service.NewObjectField(FieldTLS,
			service.NewStringEnumField(FieldTLSMode, TLSModes...).
				Description("TLS to PostgreSQL (libpq's sslmode): disable; prefer (TLS if offered); require (encrypted, not verified); verify-ca (certificate checked); verify-full (certificate and host name checked). Empty keeps the dsn's (libpq's default: prefer).").
				Default(""),
			service.NewStringField(FieldTLSRootCAFile).Description("PEM file of the CA that signed the server's certificate (verify-ca, verify-full).").Default(""),
			service.NewStringField(FieldTLSClientCert).Description("PEM client certificate (with client_key_file).").Default(""),
			service.NewStringField(FieldTLSClientKey).Description("PEM client key (with client_cert_file).").Default(""),
		).Description("TLS to PostgreSQL.").
			LintRule(speclint.Rule(
				speclint.Check(fmt.Sprintf(`this.%s.or("") != "" && ![%q, %q].contains(this.%s.or(""))`, FieldTLSRootCAFile, tlsModeVerifyCA, tlsModeVerifyFull, FieldTLSMode), msgRootCANeedsMode),
				speclint.Check(fmt.Sprintf(`(this.%s.or("") == "") != (this.%s.or("") == "")`, FieldTLSClientCert, FieldTLSClientKey), msgCertAndKey),
			)),
	}
}

// LintChecks are the component-wide checks of the connection fields (speclint.Check expressions),
// for the spec's LintRule: a dsn or a host.
func LintChecks() []string {
	return []string{speclint.Check(fmt.Sprintf(`this.%s.or("") == "" && this.%s.or("") == ""`, FieldDSN, FieldHost), msgDSNOrHost)}
}

// Parse reads the fields added by Fields.
func Parse(conf *service.ParsedConfig) (Config, error) {
	r := confread.New(conf)
	c := Config{
		DSN:        r.String(FieldDSN),
		Host:       r.String(FieldHost),
		User:       r.String(FieldUser),
		Password:   r.String(FieldPassword),
		Database:   r.String(FieldDatabase),
		TLSMode:    r.String(FieldTLS, FieldTLSMode),
		RootCAFile: r.String(FieldTLS, FieldTLSRootCAFile),
		CertFile:   r.String(FieldTLS, FieldTLSClientCert),
		KeyFile:    r.String(FieldTLS, FieldTLSClientKey),
		Port:       r.Int(FieldPort),
	}
	return c, r.Err()
}

// Validate checks the fields; the error (code pg_config) starts with the field's path and names
// the fix.
func (c Config) Validate() error {
	known := false
	for _, m := range TLSModes {
		known = known || c.TLSMode == m
	}
	switch {
	case !known:
		return configError(fmt.Sprintf("%s.%s: %q is not one of %s", FieldTLS, FieldTLSMode, c.TLSMode, strings.Join(TLSModes[1:], ", ")),
			"set "+FieldTLS+"."+FieldTLSMode+" to one of them (libpq's sslmode), or leave it empty to keep the dsn's")
	case c.RootCAFile != "" && c.TLSMode != tlsModeVerifyCA && c.TLSMode != tlsModeVerifyFull:
		return configError(msgRootCANeedsMode, "set "+FieldTLS+"."+FieldTLSMode+" to "+tlsModeVerifyFull+" (or "+tlsModeVerifyCA+") so the CA is used")
	case (c.CertFile == "") != (c.KeyFile == ""):
		return configError(msgCertAndKey, "set both "+FieldTLS+"."+FieldTLSClientCert+" and "+FieldTLS+"."+FieldTLSClientKey+", or neither")
	case c.DSN == "" && c.Host == "":
		return configError(msgDSNOrHost, "for example "+FieldDSN+": postgres://pgrelay:${PGPASSWORD}@127.0.0.1:5432/app")
	case c.Port < 0 || c.Port > MaxPort:
		return configError(fmt.Sprintf("%s: %d is not in 0-%d", FieldPort, c.Port, MaxPort), "set "+FieldPort+" to the server's port (5432 by default), or 0 to keep the dsn's")
	}
	if _, err := c.ConnConfig(); err != nil {
		return configError(fmt.Sprintf("%s: %v", FieldDSN, err),
			"write "+FieldDSN+" as a URL (postgres://user@host:5432/database?sslmode=require) or as key=value pairs (host=h port=5432 user=u dbname=app), with the password in ${ENV}")
	}
	return nil
}

// configError is a pg_config error: msg starts with the field's path.
func configError(msg, fix string) error { return errcode.New(errcode.PGConfig, msg, fix) }

// ConnConfig builds a query connection's config with the session settings of DESIGN §2.
func (c Config) ConnConfig() (*pgconn.Config, error) {
	// Explicit fields override the DSN's: libpq takes the last value of a repeated key, and a URL's
	// query parameters override its other parts.
	cfg, err := pgconn.ParseConfig(joinDSN(c.DSN, c.fieldPairs()))
	if err != nil {
		return nil, fmt.Errorf("parse connection settings: %w", c.redact(err))
	}
	convert.ApplySettings(cfg.RuntimeParams)
	cfg.DialFunc = rawio.Dialer(cfg.DialFunc)
	if c.ApplicationName != "" {
		cfg.RuntimeParams["application_name"] = c.ApplicationName
	}
	return cfg, nil
}

// ReplicationConfig is ConnConfig for a logical replication connection.
func (c Config) ReplicationConfig() (*pgconn.Config, error) {
	cfg, err := c.ConnConfig()
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["replication"] = "database"
	return cfg, nil
}

// PoolConfig is a pgxpool config of at most maxConns connections (0: pgxpool's default).
func (c Config) PoolConfig(maxConns int) (*pgxpool.Config, error) {
	cc, err := c.ConnConfig()
	if err != nil {
		return nil, err
	}
	// pgxpool.ParseConfig wants a string; start from a trivial one and put the parsed config in.
	pc, err := pgxpool.ParseConfig("")
	if err != nil {
		return nil, err
	}
	pc.ConnConfig.Config = *cc
	if maxConns > 0 {
		pc.MaxConns = int32(maxConns)
	}
	pc.MaxConnIdleTime = time.Minute
	return pc, nil
}

// fieldPairs renders the set fields as libpq key='value' pairs.
func (c Config) fieldPairs() []string {
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
	if c.ConnectTimeout > 0 {
		add("connect_timeout", fmt.Sprint(int(c.ConnectTimeout.Seconds())))
	}
	return kv
}

// joinDSN adds key='value' pairs to a DSN; for a URL they become query parameters.
func joinDSN(dsn string, kv []string) string {
	if len(kv) == 0 {
		return dsn
	}
	if !strings.HasPrefix(dsn, dsnURLPrefix) && !strings.HasPrefix(dsn, dsnURLPrefixLong) {
		return strings.TrimSpace(dsn + " " + strings.Join(kv, " "))
	}
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	q := make([]string, len(kv))
	for i, p := range kv {
		k, v, _ := strings.Cut(p, "=")
		v = strings.NewReplacer(`\'`, `'`, `\\`, `\`).Replace(strings.Trim(v, "'"))
		q[i] = k + "=" + strings.ReplaceAll(url.QueryEscape(v), "+", "%20")
	}
	return dsn + sep + strings.Join(q, "&")
}

// redact hides the password in an error from the parser.
func (c Config) redact(err error) error {
	if c.Password == "" {
		return err
	}
	return fmt.Errorf("%s", strings.ReplaceAll(err.Error(), c.Password, "xxxxx"))
}
