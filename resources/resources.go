// Package resources embeds the files pgrelay sends to servers: Lua scripts for Redis and SQL for
// PostgreSQL. They are plain files so a person can read them and run them by hand.
package resources

import (
	"embed"
)

// Files holds every embedded resource, by file name.
//
//go:embed *.lua *.sql
var Files embed.FS

// MustRead returns an embedded file's contents; a missing name is a programming error.
func MustRead(name string) string {
	b, err := Files.ReadFile(name)
	if err != nil {
		panic("resources: " + err.Error())
	}
	return string(b)
}
