// Package scanner is the implementation of the database backstop described
// in the public package github.com/delaybridge/delaybridge/scanner.
package scanner
