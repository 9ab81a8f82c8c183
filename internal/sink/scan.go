package sink

import (
	"encoding/json"

	"github.com/pgrelay/pgrelay/internal/jsonscan"
)

// scanObject splits a JSON object into its top-level keys and the exact bytes of their values,
// validating the whole document on the way (strings must be UTF-8, as RFC 8259 requires: a value is
// never passed on with bytes PostgreSQL would refuse or encoding/json would replace). Unlike encoding/json it decodes nothing below the top
// level and copies no value.
func scanObject(b []byte) (Row, error) {
	row := make(Row, 8)
	err := scanMembers(b, func(key []byte, escaped bool, val []byte) error {
		k := string(key)
		if escaped {
			if err := json.Unmarshal(key, &k); err != nil {
				return err
			}
		} else {
			k = k[1 : len(k)-1]
		}
		row[k] = json.RawMessage(val)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return row, nil
}

// scanMembers validates the JSON object b and calls fn with each member: the key as written
// (quotes included; escaped says whether it holds a backslash) and the value's exact bytes.
func scanMembers(b []byte, fn func(key []byte, escaped bool, val []byte) error) error {
	return jsonscan.Members(b, func(key []byte, escaped bool, v0, v1 int) error { return fn(key, escaped, b[v0:v1]) })
}
