package control

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"unicode/utf8"
)

// Name is a file name or path as the kernel keeps it: any bytes but NUL,
// not necessarily UTF-8. A JSON string cannot carry bytes that are not
// UTF-8 (encoding/json replaces each with U+FFFD, so "caf\xe9" and
// "caf\xe8" would arrive as the same name), so a Name is a JSON string
// when it is valid UTF-8 and otherwise an object with its bytes in
// standard base64:
//
//	"/srv/q/café.txt"
//	{"base64":"L3Nydi9xL2NhZukudHh0"}    (the bytes of "/srv/q/caf\xe9.txt")
//
// Both forms are read back to the same bytes.
type Name string

type nameBytes struct {
	Base64 string `json:"base64"`
}

// MarshalJSON implements json.Marshaler.
func (n Name) MarshalJSON() ([]byte, error) {
	if utf8.ValidString(string(n)) {
		return json.Marshal(string(n))
	}
	return json.Marshal(nameBytes{Base64: base64.StdEncoding.EncodeToString([]byte(n))})
}

// UnmarshalJSON implements json.Unmarshaler.
func (n *Name) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		*n = Name(s)
		return nil
	}
	var nb nameBytes
	if err := json.Unmarshal(b, &nb); err != nil {
		return fmt.Errorf("control: a name is a JSON string or {\"base64\": ...}: %w", err)
	}
	raw, err := base64.StdEncoding.DecodeString(nb.Base64)
	if err != nil {
		return fmt.Errorf("control: name: %w", err)
	}
	*n = Name(raw)
	return nil
}

// Names converts paths to Names.
func Names(paths []string) []Name {
	out := make([]Name, len(paths))
	for i, p := range paths {
		out[i] = Name(p)
	}
	return out
}
