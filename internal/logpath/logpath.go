// Package logpath puts file names in log fields so that each reads back
// as exactly the name it was: zap's encoders escape a field for JSON, but
// write invalid UTF-8 as U+FFFD, which loses the bytes.
//
// A name that is valid UTF-8 and does not begin with a double quote is
// logged as it is; any other is logged quoted as Go quotes it
// (strconv.Quote: "\xff" for a byte that is not UTF-8). A field's value
// that begins with a double quote is therefore always the quoted form
// (Parse undoes it).
package logpath

import (
	"strconv"
	"strings"
	"unicode/utf8"

	"go.uber.org/zap"
)

// Form is the text logged for the name p.
func Form(p string) string {
	if utf8.ValidString(p) && !strings.HasPrefix(p, `"`) {
		return p
	}
	return strconv.Quote(p)
}

// Parse is the name whose Form is s. It fails only on a quoted form that
// strconv.Unquote refuses.
func Parse(s string) (string, error) {
	if !strings.HasPrefix(s, `"`) {
		return s, nil
	}
	return strconv.Unquote(s)
}

// String is the field key holding the name p (Form).
func String(key, p string) zap.Field { return zap.String(key, Form(p)) }

// Strings is the field key holding the names ps, each as Form writes it.
func Strings(key string, ps []string) zap.Field {
	fs := make([]string, len(ps))
	for i, p := range ps {
		fs[i] = Form(p)
	}
	return zap.Strings(key, fs)
}
