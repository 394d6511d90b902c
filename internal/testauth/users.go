package testauth

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"golang.org/x/crypto/bcrypt"
)

// BcryptHash hashes password at the lowest cost, as a server configuration may hold it.
func BcryptHash(t testing.TB, password string) string {
	t.Helper()
	h, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	return string(h)
}

// NkeyUser creates a user nkey and returns its public key and the option that signs in
// with it.
func NkeyUser(t testing.TB) (string, nats.Option) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return pub, nats.Nkey(pub, kp.Sign)
}
