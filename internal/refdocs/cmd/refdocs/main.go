// Command refdocs writes pgrelay's reference pages from the plugin specs into the directory given
// (go generate ./internal/refdocs writes docs/reference).
package main

import (
	"fmt"
	"os"

	"github.com/pgrelay/pgrelay/internal/refdocs"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: refdocs <dir>")
		os.Exit(2)
	}
	if err := refdocs.WriteAll(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
