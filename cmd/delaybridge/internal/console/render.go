package console

import (
	"bytes"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/delaybridge/delaybridge/cmd/delaybridge/internal/cli"
	"github.com/delaybridge/delaybridge/internal/redact"
)

// view is what every page template receives: the layout's fields and the
// page's own Data.
type view struct {
	Title    string
	Nav      string
	Who      string
	ReadOnly bool
	CSRF     string
	Flash    string
	Error    string
	Refresh  int
	// Shard names the shard the page is about, "" on an unsharded console
	// and on the overview; Shards switch to the same page of each shard.
	Shard  string
	Shards []shardLink
	Data   any
}

// parsePages parses each page template with the layout.
func parsePages() (map[string]*template.Template, error) {
	funcs := template.FuncMap{
		"when":  fmtTime,
		"ago":   cli.Ago,
		"dur":   fmtDur,
		"short": shortText,
		"add":   func(a, b int) int { return a + b },
		"shard": withShard,
	}
	names, err := fs.Glob(webFiles, "web/*.html")
	if err != nil {
		return nil, err
	}
	pages := map[string]*template.Template{}
	for _, n := range names {
		base := strings.TrimSuffix(strings.TrimPrefix(n, "web/"), ".html")
		if base == "layout" {
			continue
		}
		t, err := template.New(base).Funcs(funcs).ParseFS(webFiles, "web/layout.html", n)
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", n, err)
		}
		pages[base] = t
	}
	return pages, nil
}

// render writes page with status; the page is rendered into a buffer
// first, so a template error becomes a clean 500.
func (c *console) render(w http.ResponseWriter, r *http.Request, page string, status int, v view) {
	v.Who, v.ReadOnly = who(r), c.readOnly
	v.CSRF = c.csrf.token(who(r))
	if v.Nav == "" {
		v.Nav = page
	}
	if v.Shard != "" && (page == "tasks" || page == "dead") {
		for _, name := range c.shardNames() {
			v.Shards = append(v.Shards, shardLink{Name: name, Href: withShard("/"+page, name), Here: name == v.Shard})
		}
	}
	var buf bytes.Buffer
	if err := c.pages[page].ExecuteTemplate(&buf, "layout", v); err != nil {
		c.log.Error("console: rendering a page failed", "page", page, "err", err)
		http.Error(w, "500 internal error: rendering failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = buf.WriteTo(w)
}

// fail renders err on the error page; bad input is a 400, a missing task a
// 404, anything else a 500 whose cause is logged, not shown.
func (c *console) fail(w http.ResponseWriter, r *http.Request, status int, err error) {
	msg := err.Error()
	if status >= 500 {
		c.log.Error("console: request failed", "who", who(r), "path", r.URL.Path, "err", redact.Scrub(err, c.secrets()...))
		msg = "the database could not answer; see the console's log"
	}
	c.render(w, r, "error", status, view{Title: http.StatusText(status), Nav: "none", Error: msg})
}

// failOn is fail for an error of shard sh's database: a 500 that names the
// shard.
func (c *console) failOn(w http.ResponseWriter, r *http.Request, sh *Shard, err error) {
	if sh.name == "" {
		c.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	c.logFor(sh).Error("console: request failed", "who", who(r), "path", r.URL.Path, "err", sh.describe(err))
	c.render(w, r, "error", http.StatusInternalServerError, view{Title: http.StatusText(http.StatusInternalServerError), Nav: "none",
		Error: fmt.Sprintf("shard %s: its database could not answer; see the console's log", sh.name)})
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000Z")
}

// fmtWhen writes t as cli.ParseWhen reads it back exactly: RFC 3339 in UTC to
// the millisecond, the precision the outbox keeps (and fmtTime shows).
func fmtWhen(t time.Time) string {
	return t.UTC().Format("2006-01-02T15:04:05.000Z07:00")
}

func fmtDur(d time.Duration) string {
	if d == 0 {
		return "none"
	}
	if d >= 48*time.Hour && d%(24*time.Hour) == 0 {
		return fmt.Sprintf("%dd", d/(24*time.Hour))
	}
	return d.String()
}

// shortText cuts s to n runes and makes it printable.
func shortText(n int, s string) string {
	s = cli.Printable(s)
	if utf8.RuneCountInString(s) > n {
		r := []rune(s)
		s = string(r[:n]) + "…"
	}
	return s
}
