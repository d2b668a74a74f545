module dipam.test/libcni-driver

go 1.21

require github.com/containernetworking/cni v1.3.0
