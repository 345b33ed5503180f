// An independent check of kvfence's witnessed log with Go's reference implementation of signed
// notes and transparency-log proofs (golang.org/x/mod/sumdb/note and sumdb/tlog).
//
//	c2sp_verify VKEY proof FILE         a c2sp.org/tlog-proof: the note's signature, the inclusion
//	                                    of the leaf whose data is the proof's extra line
//	c2sp_verify VKEY consistency FILE OLD_ROOT_B64
//	                                    `old N`, the proof, the note: the new tree extends the old
//
// Prints "ok ..." and exits 0, or prints the failure and exits 1.
package main

import (
	"encoding/base64"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

func fail(format string, args ...any) {
	fmt.Printf("FAILED "+format+"\n", args...)
	os.Exit(1)
}

func hashOf(text string) tlog.Hash {
	raw, err := base64.StdEncoding.DecodeString(text)
	if err != nil || len(raw) != tlog.HashSize {
		fail("bad hash %q", text)
	}
	var h tlog.Hash
	copy(h[:], raw)
	return h
}

// checkpoint opens the note with the log's key and reads its origin, size and root.
func checkpoint(vkey string, msg string) (string, int64, tlog.Hash) {
	verifier, err := note.NewVerifier(vkey)
	if err != nil {
		fail("verifier key: %v", err)
	}
	n, err := note.Open([]byte(msg), note.VerifierList(verifier))
	if err != nil {
		fail("note: %v", err)
	}
	lines := strings.Split(n.Text, "\n")
	if len(lines) < 4 {
		fail("checkpoint has %d lines", len(lines))
	}
	size, err := strconv.ParseInt(lines[1], 10, 64)
	if err != nil {
		fail("tree size: %v", err)
	}
	return lines[0], size, hashOf(lines[2])
}

func main() {
	if len(os.Args) < 4 {
		fail("usage: c2sp_verify VKEY proof|consistency FILE [OLD_ROOT]")
	}
	data, err := os.ReadFile(os.Args[3])
	if err != nil {
		fail("%v", err)
	}
	head, msg, found := strings.Cut(string(data), "\n\n")
	if !found {
		fail("no blank line before the checkpoint")
	}
	origin, size, root := checkpoint(os.Args[1], msg)
	lines := strings.Split(head, "\n")
	switch os.Args[2] {
	case "proof":
		if lines[0] != "c2sp.org/tlog-proof@v1" || !strings.HasPrefix(lines[1], "extra ") {
			fail("not a tlog proof with extra data")
		}
		extra, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(lines[1], "extra "))
		if err != nil {
			fail("extra: %v", err)
		}
		index, err := strconv.ParseInt(strings.TrimPrefix(lines[2], "index "), 10, 64)
		if err != nil {
			fail("index: %v", err)
		}
		var proof tlog.RecordProof
		for _, line := range lines[3:] {
			proof = append(proof, hashOf(line))
		}
		if err := tlog.CheckRecord(proof, size, root, index, tlog.RecordHash(extra)); err != nil {
			fail("inclusion of %d in %s@%d: %v", index, origin, size, err)
		}
		fmt.Printf("ok %s@%d includes record %d\n", origin, size, index)
	case "consistency":
		old, err := strconv.ParseInt(strings.TrimPrefix(lines[0], "old "), 10, 64)
		if err != nil || len(os.Args) < 5 {
			fail("old size or root missing")
		}
		var proof tlog.TreeProof
		for _, line := range lines[1:] {
			proof = append(proof, hashOf(line))
		}
		if err := tlog.CheckTree(proof, size, root, old, hashOf(os.Args[4])); err != nil {
			fail("%s@%d does not extend %d: %v", origin, size, old, err)
		}
		fmt.Printf("ok %s@%d extends %d\n", origin, size, old)
	default:
		fail("unknown check %q", os.Args[2])
	}
}
