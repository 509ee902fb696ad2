package watch

import "iter"

// treeIndex finds a base's listed trees by path: each root's tree (roots
// are unique in a list), and how many roots lie strictly below each
// directory. A look-up walks up a path, so it costs O(depth), not
// O(trees).
type treeIndex struct {
	byRoot map[string]*watchedTree
	below  map[string]int // directory -> listed roots strictly below it
}

// add indexes t; its root must not be indexed yet.
func (x *treeIndex) add(t *watchedTree) {
	if x.byRoot == nil {
		x.byRoot, x.below = map[string]*watchedTree{}, map[string]int{}
	}
	x.byRoot[t.Root] = t
	for a := range above(t.Root) {
		x.below[a]++
	}
}

// remove takes t out of the index (nothing if another tree is indexed at
// its root).
func (x *treeIndex) remove(t *watchedTree) {
	if x.byRoot[t.Root] != t {
		return
	}
	delete(x.byRoot, t.Root)
	for a := range above(t.Root) {
		if x.below[a]--; x.below[a] <= 0 {
			delete(x.below, a)
		}
	}
}

// at returns the tree rooted at root, or nil.
func (x *treeIndex) at(root string) *watchedTree { return x.byRoot[root] }

// holdsRoot reports whether dir is a listed root or a directory above one:
// whether a move or removal of dir can take a root away.
func (x *treeIndex) holdsRoot(dir string) bool {
	return x.byRoot[dir] != nil || x.below[dir] > 0
}

// deepest returns the tree of the deepest root that is path or above it
// (by the string prefix ending before a '/', or "/") for which ok holds,
// or nil. ok is told whether the root is path itself.
func (x *treeIndex) deepest(path string, ok func(t *watchedTree, self bool) bool) *watchedTree {
	if len(x.byRoot) == 0 {
		return nil
	}
	if t := x.byRoot[path]; t != nil && ok(t, true) {
		return t
	}
	for a := range above(path) {
		if t := x.byRoot[a]; t != nil && ok(t, false) {
			return t
		}
	}
	return nil
}

// above yields the directories above path, deepest first: each prefix of
// path that ends before a '/' (at an index above 0), then "/" (unless path
// is "/"). A root is above path when path has it as such a prefix.
func above(path string) iter.Seq[string] {
	return func(yield func(string) bool) {
		for i := len(path) - 1; i > 0; i-- {
			if path[i] == '/' && !yield(path[:i]) {
				return
			}
		}
		if path != "/" {
			yield("/")
		}
	}
}
