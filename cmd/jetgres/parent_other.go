//go:build !linux

package main

// stopWithGoRun does nothing outside Linux, which alone can signal a child when its parent
// exits: there, stop jetgres itself rather than the go command that runs it.
func stopWithGoRun() (bool, error) { return false, nil }
