package pg

// HasSubjectIndex reports whether the stream has a subject index.
func (db *DB) HasSubjectIndex(id int64) bool {
	db.subjects.mu.Lock()
	defer db.subjects.mu.Unlock()
	_, ok := db.subjects.m[id]
	return ok
}

// ForgetSubjectIndex drops the stream's subject index, as a replica that never built one
// has none.
func (db *DB) ForgetSubjectIndex(id int64) { db.subjects.forget(id) }
